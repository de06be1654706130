"""Time-aligned charts of training runs: matplotlib (Agg) PNGs for alert threads, `/run plot`
and `/run compare`.

The "one time-aligned view" of SIGNALS.md: loss, eval loss, LR, grad norm, throughput and GPU
memory in panels that share the step axis, with checkpoints, a finding's onset and detection,
and the rollback target marked, and earlier attempts drawn faded behind the current one.

:func:`draw` is a pure function from a :class:`Chart` to PNG bytes (the same chart gives the
same bytes); the loaders (:func:`run_chart`, :func:`finding_chart`, :func:`compare_chart`)
build charts from the store. Long histories are reduced for drawing with a min/max envelope
per bucket, so a one-step spike keeps its height; NaN and Inf points are never dropped: they
are drawn as markers at the top of their panel.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bot.store import Store, UnknownRun

DEFAULT_TAGS = ("train/loss", "eval/loss", "lr", "grad_norm", "throughput", "gpu_mem")
# Short names people type for the canonical tags.
TAG_ALIASES = {"loss": "train/loss", "train": "train/loss", "eval": "eval/loss",
               "val": "eval/loss", "val_loss": "eval/loss", "learning_rate": "lr",
               "grad": "grad_norm", "gradnorm": "grad_norm", "tps": "throughput",
               "tokens_per_sec": "throughput", "mem": "gpu_mem", "memory": "gpu_mem"}
PANEL_TITLES = {"loss": "loss", "lr": "learning rate", "grad_norm": "grad norm",
                "throughput": "throughput", "gpu_mem": "GPU memory"}
TAG_COLORS = {"train/loss": "#1f77b4", "eval/loss": "#ff7f0e", "lr": "#2ca02c",
              "grad_norm": "#d62728", "throughput": "#9467bd", "gpu_mem": "#8c564b"}
OTHER_COLORS = ("#17becf", "#bcbd22", "#e377c2", "#7f7f7f")
RUN_COLORS = ("#1f77b4", "#d62728")  # compare: first run, second run
# A positive panel spanning more than this many times (a spike) is drawn on a log axis; grad
# norm spikes of 10-100x are the signal, so it goes log sooner. A schedule stays linear.
LOG_RANGE = {"grad_norm": 3.0}
LOG_RANGE_DEFAULT = 10.0
LINEAR_TAGS = frozenset({"lr"})
MAX_POINTS = 2000  # per line, after the envelope (1,000 buckets × min and max)
MAX_PANELS = 8
MAX_CHECKPOINT_TICKS = 2000
FADED_ALPHA = 0.3
WIDTH_IN, PANEL_HEIGHT_IN, DPI = 11.0, 1.7, 100
LEFT_IN, RIGHT_IN, TOP_IN, BOTTOM_IN = 0.8, 2.4, 0.6, 0.45  # the legends sit on the right
PNG_COMPRESSION = 3  # zlib level: 6 (the default) takes twice as long for 10% smaller files

_draw_lock = threading.Lock()  # matplotlib's font cache and text layout are shared state


class UnknownTag(LookupError):
    def __init__(self, run: str, tags: Sequence[str], known: Sequence[str]) -> None:
        self.tags = list(tags)
        names = ", ".join(known) if known else "none"
        super().__init__(f"{run} has no metric {', '.join(repr(t) for t in tags)}; "
                         f"its metrics: {names}")


class NothingToPlot(LookupError):
    """A run, or a step range, without the points a chart needs; the message says what there
    is instead."""


@dataclass(frozen=True)
class Line:
    """One series in one panel."""

    tag: str
    steps: np.ndarray
    values: np.ndarray
    label: str
    color: str
    dashed: bool = False
    faded: bool = False  # an earlier attempt, drawn behind the current one


@dataclass(frozen=True)
class StepMark:
    """A vertical line across every panel: ``kind`` is onset, detected or rollback."""

    step: int
    kind: str
    label: str


@dataclass
class Chart:
    title: str
    lines: list[Line]
    checkpoints: Sequence[int] = ()
    marks: Sequence[StepMark] = ()
    subtitle: str = ""
    steps: tuple[int | None, int | None] = (None, None)  # x range; None: the data's


@dataclass
class ChartFile:
    """A drawn chart with what an upload needs."""

    png: bytes
    filename: str
    title: str
    comment: str
    extra: dict[str, Any] = field(default_factory=dict)


# -- downsampling ----------------------------------------------------------------------------


def envelope(steps: np.ndarray, values: np.ndarray,
             max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Finite points reduced to at most ``max_points`` (+2) by keeping the minimum and the
    maximum of each bucket of consecutive points, and the first and last point: a spike
    one step wide keeps its height. Non-finite values must be removed first."""
    n = len(values)
    buckets = max(1, max_points // 2)
    if n <= max_points:
        return steps, values
    size = -(-n // buckets)
    buckets = -(-n // size)
    pad = buckets * size - n  # < size: every bucket holds at least one real point
    low = np.concatenate([values, np.full(pad, np.inf)]).reshape(buckets, size).argmin(axis=1)
    high = np.concatenate([values, np.full(pad, -np.inf)]).reshape(buckets, size).argmax(axis=1)
    base = np.arange(buckets) * size
    keep = np.unique(np.concatenate([base + low, base + high, [0, n - 1]]))
    return steps[keep], values[keep]


def split_nonfinite(steps: np.ndarray, values: np.ndarray, max_points: int = MAX_POINTS
                    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(finite steps, finite values, {"NaN": steps, "inf": steps, "-inf": steps}); the
    non-finite steps thinned to one per bucket when there are very many."""
    finite = np.isfinite(values)
    bad: dict[str, np.ndarray] = {}
    if not finite.all():
        for name, mask in (("NaN", np.isnan(values)), ("inf", np.isposinf(values)),
                           ("-inf", np.isneginf(values))):
            where = np.flatnonzero(mask)
            if len(where) > max_points:
                _, first = np.unique(where * max_points // len(values), return_index=True)
                where = where[first]
            if len(where):
                bad[name] = steps[where]
    return steps[finite], values[finite], bad


# -- drawing ---------------------------------------------------------------------------------


def panel_of(tag: str) -> str:
    return "loss" if tag in ("train/loss", "eval/loss") else tag


def _panels(lines: Iterable[Line]) -> list[str]:
    seen: list[str] = []
    for line in lines:
        panel = panel_of(line.tag)
        if panel not in seen:
            seen.append(panel)
    return seen[:MAX_PANELS]


def _use_log(panel: str, values: list[np.ndarray]) -> bool:
    finite = [v for v in values if len(v)]
    if not finite:
        return False
    low = min(float(v.min()) for v in finite)
    high = max(float(v.max()) for v in finite)
    if low <= 0 or panel in LINEAR_TAGS:
        return False
    return high / low > LOG_RANGE.get(panel, LOG_RANGE_DEFAULT)


def draw(chart: Chart, *, max_points: int = MAX_POINTS) -> bytes:
    """The chart as PNG bytes: one panel per metric group, sharing the step axis."""
    from matplotlib.figure import Figure  # Agg through the Figure API: no pyplot state
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    panels = _panels(chart.lines)
    if not panels:
        raise ValueError("nothing to draw: the chart has no series")
    prepared = []
    for line in chart.lines:
        if panel_of(line.tag) not in panels:
            continue
        steps = np.asarray(line.steps, dtype=np.int64)
        values = np.asarray(line.values, dtype=np.float64)
        steps, values, bad = split_nonfinite(steps, values, max_points)
        steps, values = envelope(steps, values, max_points)
        prepared.append((line, steps, values, bad))

    with _draw_lock:
        height = TOP_IN + BOTTOM_IN + PANEL_HEIGHT_IN * len(panels)
        fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
        # Fixed margins instead of a layout engine: measuring every tick label for layout
        # costs more than drawing the data.
        fig.subplots_adjust(left=LEFT_IN / WIDTH_IN, right=1 - RIGHT_IN / WIDTH_IN,
                            top=1 - TOP_IN / height, bottom=BOTTOM_IN / height, hspace=0.12)
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        by_panel = dict(zip(panels, axes, strict=True))
        for panel, ax in by_panel.items():
            ax.set_ylabel(PANEL_TITLES.get(panel, panel), fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, color="0.9", linewidth=0.6)
            ax.yaxis.get_major_formatter().set_useOffset(False)
            ax.set_axisbelow(True)
            values = [v for line, _, v, _ in prepared if panel_of(line.tag) == panel]
            if _use_log(panel, values):
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(NullFormatter())
        for line, steps, values, bad in sorted(prepared, key=lambda p: not p[0].faded):
            ax = by_panel[panel_of(line.tag)]
            sparse = len(steps) <= 60
            ax.plot(steps, values, color=line.color, linestyle="--" if line.dashed else "-",
                    linewidth=0.8 if line.faded else 1.1,
                    alpha=FADED_ALPHA if line.faded else 1.0, label=line.label,
                    marker="o" if sparse else None, markersize=2.5, zorder=2 if line.faded
                    else 3)
            for name, where in bad.items():
                ax.plot(where, np.full(len(where), 0.97), linestyle="none",
                        marker="X" if name == "NaN" else "^", markersize=6,
                        color=line.color, markeredgecolor="black", markeredgewidth=0.5,
                        alpha=FADED_ALPHA if line.faded else 1.0,
                        transform=ax.get_xaxis_transform(), clip_on=False, zorder=5,
                        label=f"{line.label}: {name} ×{len(where)}")
        _draw_marks(chart, axes)
        lo, hi = chart.steps
        if lo is not None or hi is not None:
            axes[0].set_xlim(lo, hi)
        for ax in axes:
            handles, labels = ax.get_legend_handles_labels()
            if handles:
                ax.legend(handles, labels, fontsize=7, loc="upper left",
                          bbox_to_anchor=(1.005, 1.0), borderaxespad=0, frameon=False)
        axes[-1].set_xlabel("step", fontsize=8)
        fig.suptitle(chart.title, fontsize=11, fontweight="bold")
        if chart.subtitle:
            axes[0].set_title(chart.subtitle, fontsize=8, color="0.35", loc="left")
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", metadata={"Software": None},
                    pil_kwargs={"compress_level": PNG_COMPRESSION})
    return buffer.getvalue()


MARK_STYLE = {"onset": dict(color="#d62728", linestyle="-", linewidth=1.3),
              "detected": dict(color="#ff7f0e", linestyle="--", linewidth=1.1),
              "rollback": dict(color="#2ca02c", linestyle=":", linewidth=1.4)}


def _draw_marks(chart: Chart, axes: Sequence[Any]) -> None:
    checkpoints = np.asarray(sorted(chart.checkpoints), dtype=np.int64)
    if len(checkpoints) > MAX_CHECKPOINT_TICKS:
        checkpoints = checkpoints[:: -(-len(checkpoints) // MAX_CHECKPOINT_TICKS)]
    onset = next((m.step for m in chart.marks if m.kind == "onset"), None)
    detected = next((m.step for m in chart.marks if m.kind == "detected"), None)
    for i, ax in enumerate(axes):
        if len(checkpoints):
            ax.vlines(checkpoints, 0, 0.07, transform=ax.get_xaxis_transform(),
                      color="0.35", linewidth=1.0, label="checkpoint" if i == 0 else None,
                      zorder=1.5)
        if onset is not None and detected is not None and detected > onset:
            ax.axvspan(onset, detected, color="#d62728", alpha=0.08, zorder=1)
        for mark in chart.marks:
            ax.axvline(mark.step, **MARK_STYLE.get(mark.kind, MARK_STYLE["onset"]),
                       label=mark.label if i == 0 else None, zorder=1.5)  # behind the data


# -- loading from the store ------------------------------------------------------------------


@dataclass
class RunSeries:
    """A run's metrics as arrays: ``series[attempt][tag] = (steps, values)``."""

    run: str
    attempt: int
    series: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]
    checkpoints: list[int]
    config: dict[str, Any] | None = None

    def current(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return self.series.get(self.attempt, {})

    @property
    def tags(self) -> list[str]:
        return order_tags({t for by_tag in self.series.values() for t in by_tag})


def order_tags(tags: Iterable[str]) -> list[str]:
    """The canonical metrics first, in the view's order, then the rest alphabetically."""
    tags = set(tags)
    return [t for t in DEFAULT_TAGS if t in tags] + sorted(tags - set(DEFAULT_TAGS))


def resolve_tags(run: str, asked: Sequence[str], known: Sequence[str]) -> list[str]:
    """The tags a person typed, as stored: exact names, short names (``loss``, ``val``,
    ``mem``, …) or a prefix ending in ``/`` (``eval/general/``). Raises :class:`UnknownTag`."""
    chosen: list[str] = []
    missing = []
    for word in asked:
        tag = TAG_ALIASES.get(word.lower(), word).lower()
        matches = [t for t in known if t.lower() == tag] or \
            [t for t in known if tag.endswith("/") and t.lower().startswith(tag)]
        if not matches:
            missing.append(word)
        chosen += [t for t in matches if t not in chosen]
    if missing:
        raise UnknownTag(run, missing, known)
    return chosen


def load_series(store: Store, run: str, tags: Sequence[str] | None = None, *,
                attempts: str = "all", steps: tuple[int | None, int | None] = (None, None),
                max_points: int | None = MAX_POINTS) -> RunSeries:
    """Read a run's points; ``attempts="current"`` skips the earlier attempts. A series longer
    than ``max_points`` is reduced for drawing inside SQLite (:meth:`Store.chart_points`), so
    a million points never cross into Python. Raises :class:`UnknownRun`."""
    info = store.run(run)
    if info is None:
        raise UnknownRun(run, store.run_names())
    attempt = info["attempt"]
    points = store.chart_points(run, attempt=attempt if attempts == "current" else None,
                                tags=tags, steps=steps, max_points=max_points)
    series: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for att, by_tag in points.items():
        for tag, rows in by_tag.items():
            table = np.array(rows, dtype=np.float64)  # SQLite keeps NaN as NULL → nan
            series.setdefault(att, {})[tag] = (table[:, 0].astype(np.int64), table[:, 1])
    config = json.loads(info["config"]) if info.get("config") else None
    return RunSeries(run, attempt, series, [c.step for c in store.checkpoints(run)], config)


def known_tags(store: Store, run: str) -> list[str]:
    return order_tags(store.tag_names(run))


def _color(tag: str, extra: list[str]) -> str:
    if tag in TAG_COLORS:
        return TAG_COLORS[tag]
    if tag not in extra:
        extra.append(tag)
    return OTHER_COLORS[extra.index(tag) % len(OTHER_COLORS)]


def run_lines(data: RunSeries, tags: Sequence[str]) -> list[Line]:
    """Earlier attempts faded, then the current attempt, metric by metric."""
    lines, extra = [], []
    for tag in tags:
        color = _color(tag, extra)
        for attempt in sorted(data.series):
            if tag not in data.series[attempt]:
                continue
            steps, values = data.series[attempt][tag]
            earlier = attempt != data.attempt
            label = f"{tag} (attempt {attempt})" if earlier else tag
            lines.append(Line(tag, steps, values, label, color, dashed=tag == "eval/loss"
                              and not earlier, faded=earlier))
    return lines


def _last_step(data: RunSeries) -> int | None:
    ends = [int(s[-1]) for s, _ in data.current().values() if len(s)]
    return max(ends) if ends else None


def _subtitle(data: RunSeries) -> str:
    parts = []
    last = _last_step(data)
    if last is not None:
        parts.append(f"step {last}")
    earlier = sorted(a for a in data.series if a != data.attempt)
    if earlier:
        parts.append("earlier attempt" + ("s " if len(earlier) > 1 else " ")
                     + ", ".join(map(str, earlier)) + " faded")
    if data.checkpoints:
        parts.append(f"{len(data.checkpoints)} checkpoints (ticks)")
    return " · ".join(parts)


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


def run_chart(store: Store, run: str, tags: Sequence[str] = (), *,
              steps: tuple[int | None, int | None] = (None, None)) -> ChartFile:
    """`/run plot`: the time-aligned view of a run (the default panels with data, or the
    tags asked for). Raises :class:`UnknownRun`, :class:`UnknownTag` or
    :class:`NothingToPlot`."""
    if store.run(run) is None:
        raise UnknownRun(run, store.run_names())
    known = known_tags(store, run)
    chosen = resolve_tags(run, tags, known) if tags else [t for t in DEFAULT_TAGS
                                                         if t in known]
    if not known:
        raise NothingToPlot(f"{run} has no metrics yet; nothing to plot")
    if not chosen:
        raise NothingToPlot(f"{run} has none of the default metrics; name some, e.g. "
                            f"`/run plot {run} {known[0]}` (its metrics: {', '.join(known)})")
    data = load_series(store, run, chosen, steps=steps)
    if not data.series:
        first, last = store.step_span(run)
        lo, hi = steps
        raise NothingToPlot(f"{run} has no points in steps {'' if lo is None else lo}-"
                            f"{'' if hi is None else hi}; its steps run {first}-{last}")
    title = f"{run} · attempt {data.attempt}"
    png = draw(Chart(title, run_lines(data, chosen), data.checkpoints,
                     subtitle=_subtitle(data), steps=steps))
    last = _last_step(data)
    return ChartFile(png, f"{safe_name(run)}-attempt{data.attempt}-step{last}.png", title,
                     f"{run}: {', '.join(chosen)} up to step {last}",
                     {"tags": chosen, "attempt": data.attempt, "step": last})


def finding_chart(store: Store, finding: dict[str, Any]) -> ChartFile:
    """The alert thread's chart: the default panels plus the finding's metric, its onset and
    detection marked, and the rollback target. ``finding`` is a stored finding row or its
    ``to_dict()``."""
    f = json.loads(finding["data"]) if isinstance(finding.get("data"), str) else finding
    run = f["run"]
    known = known_tags(store, run)
    wanted = [t for t in DEFAULT_TAGS if t in known]
    if f.get("metric") in known and f["metric"] not in wanted:
        wanted.append(f["metric"])
    data = load_series(store, run, wanted)
    onset, detected = f["onset_step"], f["detected_step"]
    marks = [StepMark(onset, "onset", f"onset (step {onset})")]
    if detected != onset:
        marks.append(StepMark(detected, "detected", f"detected (step {detected})"))
    rollback = f.get("rollback_to")
    if rollback:
        marks.append(StepMark(rollback["step"], "rollback",
                              f"roll back to step {rollback['step']}"))
    title = f"{run} · attempt {f.get('attempt', data.attempt)} · {f['signal']} from step {onset}"
    png = draw(Chart(title, run_lines(data, wanted), data.checkpoints, marks,
                     subtitle=_subtitle(data)))
    fingerprint = f.get("fingerprint", "")
    return ChartFile(png, f"{safe_name(run)}-{f['signal']}-step{onset}-{fingerprint[:8]}.png",
                     title, f"{f['signal']} on {run}: the run around step {onset} "
                            f"(onset and detection marked; faded lines are earlier attempts)")


def compare_chart(store: Store, first: str, second: str, tags: Sequence[str] = ()
                  ) -> ChartFile | None:
    """`/run compare`: both runs' current attempts overlaid, panel by panel; None when
    neither run has any of the default metrics (and no tags were asked for)."""
    a = load_series(store, first, attempts="current")
    b = load_series(store, second, attempts="current")
    known = order_tags(set(a.current()) | set(b.current()))
    chosen = resolve_tags(f"{first} or {second}", tags, known) if tags else \
        [t for t in DEFAULT_TAGS if t in known]
    if not chosen:
        return None
    lines = []
    for tag in chosen:
        for data, color in ((a, RUN_COLORS[0]), (b, RUN_COLORS[1])):
            if tag in data.current():
                steps, values = data.current()[tag]
                lines.append(Line(tag, steps, values, f"{data.run} {tag}", color,
                                  dashed=tag == "eval/loss"))
    title = f"{first} vs {second}"
    png = draw(Chart(title, lines, subtitle=f"{first} attempt {a.attempt} (blue) · {second} "
                                              f"attempt {b.attempt} (red)"))
    return ChartFile(png, f"{safe_name(first)}-vs-{safe_name(second)}.png", title,
                     f"{first} vs {second}: {', '.join(chosen)}", {"tags": chosen})


def parse_step_range(word: str) -> tuple[int | None, int | None] | None:
    """``1000-2000``, ``1000-`` or ``-2000`` as a step range; None when ``word`` is not one."""
    found = re.fullmatch(r"(\d*)-(\d*)", word)
    if not found or not any(found.groups()):
        return None
    lo, hi = (int(g) if g else None for g in found.groups())
    if lo is not None and hi is not None and hi < lo:
        return None
    return lo, hi
