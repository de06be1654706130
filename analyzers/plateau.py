"""Loss plateau: the training loss has stopped falling over a long window."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from analyzers import register
from analyzers.base import Analyzer, RunData
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_number
from analyzers.stats.robust import median_se, row_median_sd
from analyzers.streaming import FiniteIndex, Streams

# Rows of windows handled at once: bounds memory when ``window`` is large.
_CHUNK_ELEMENTS = 2_000_000


@dataclass(frozen=True)
class _Evaluations:
    """Per evaluation: window start, medians of the first and last thirds, the relative
    improvement between them and its standard error."""

    starts: np.ndarray
    widths: np.ndarray
    first: np.ndarray
    last: np.ndarray
    improvement: np.ndarray
    standard_error: np.ndarray


@dataclass(frozen=True)
class _Window:
    """One flat window as a finding reports it, in steps."""

    window_steps: tuple[int, int]
    width: int
    first: float
    last: float
    improvement: float
    standard_error: float
    required: float  # the fall below which this window counts as flat
    band: tuple[float, float]


@dataclass
class _Episode:
    onset_step: int
    fired: _Window
    resolved_step: int | None = None


@dataclass
class _State:
    """What one poll leaves for the next: the evaluations judged so far, the non-finite
    positions seen (to map finite points to positions), per window length (the window,
    the long window) the flat evaluations in a row and the step the first of them starts
    at, and the episodes (the last may be open)."""

    evaluated: int = 0
    index: FiniteIndex = field(default_factory=FiniteIndex)
    flat_runs: list[int] = field(default_factory=lambda: [0, 0])
    run_start_steps: list[int] = field(default_factory=lambda: [0, 0])
    episodes: list[_Episode] = field(default_factory=list)
    fresh: bool | None = None  # the attempt starts at the start of training (None: unknown)


@register
class Plateau(Analyzer):
    """Loss plateau: the loss stays in a narrow band with no downward trend.

    *Signal* (SIGNALS.md ``plateau``). Every ``stride`` finite points after the warm-up,
    the last ``window`` points are judged as a whole: the median of their first third is
    compared with the median of their last third. The window is *flat* when the relative
    improvement ``(first - last) / |first|`` stays below ``min_delta`` even after
    ``margin`` standard errors of that estimate are added to it. After ``patience`` flat
    evaluations in a row the finding fires; its onset is the first step of the first flat
    window. At each evaluation a *long window*, ``span`` times as wide and ending at the
    same point, is judged the same way against the same rate of fall (``span *
    min_delta``); ``span_patience`` flat long windows in a row also fire. Its standard
    error is about ``1 / sqrt(span)`` of the window's while the fall it allows is ``span``
    times larger, so it can tell a stalled loss from one still falling at ``min_delta``
    where the window's noise is too large to (a per-step fine-tune). It resolves at the
    first evaluation whose improvement, less one standard error, reaches
    ``2 * min_delta`` (the loss is falling again); a later plateau is a new finding.
    A run that has not learned at all (a frozen model, an LR of 0, gradients that never
    arrive) need not wait for the first full window: a run that starts from scratch (its
    first logged step within two logging intervals of step 0, not a resumed run) is also
    judged from ``early_points`` finite points on, every half ``stride``, over all its
    points so far less their first fifth. Non-finite values are skipped (they are
    ``spike``'s job).

    Parameters
    ----------
    metric : str, default "train/loss"
        The tag watched.
    window : int, default 100
        Points judged together. Longer sees a slow descent that a short window takes for
        noise and can judge noisier losses (the standard error falls as one over its
        square root), but needs more history and reacts later. At least 6 (two points
        per third: the autocorrelation is measured from a third's differences).
    min_delta : float, default 0.01
        Relative improvement over the window that counts as progress (0.01 = 1%). Higher
        also flags runs that still crawl down; lower only flags truly flat ones.
    grace_period : int, default 50
        Finite points at the start before the first full window is judged (warm-up).
        Longer avoids judging the warm-up; shorter judges full windows sooner.
    patience : int, default 4
        Flat evaluations in a row before firing (the rule's ``for:`` period). With the
        default ``stride`` the first and the last of 4 windows are 30 points apart, so
        their last thirds (33 points) barely overlap: the verdict is confirmed on new
        points, not on ten-point shifts of one window whose standard error came out low
        by chance (3 in a row fired on noise in 3000-point fine-tunes). More rides out a
        momentary stall and is surer; fewer alerts sooner.
    stride : int, default 10
        Points between evaluations. Smaller reacts sooner and costs more computation.
    history : float, default 0.2
        Share of the points logged so far that a window spans once that is more than
        ``window`` (such windows are judged every tenth of their width). A pretraining
        loss falls along a power law: over a fixed 100 points its tail looks flat, over a
        fifth of the run it still falls clearly. Higher ignores slower tails and reacts
        later on a long run; 0 keeps the window fixed.
    pace : float, default 0.5
        A window that still falls significantly counts as flat only if its fall (plus one
        standard error) is under ``pace`` times the fall (less one standard error) of the
        window of the same width just before it: the run's own earlier pace. A power-law
        tail slows gradually and stays above it; a stall that leaves the loss crawling
        at a fraction of its pace drops below it. Higher also flags gentler slowdowns
        (and a cosine schedule's decaying tail sooner); 0 never flags a window that
        still falls by two standard errors.
    margin : float, default 1.5
        Standard errors added to a window's improvement before it is compared with
        ``min_delta``: a window is flat only when its fall is below ``min_delta`` with
        that confidence (1.5: about 93% one-sided). A run that still falls just over
        ``min_delta`` per window is judged hundreds of times; at one standard error (84%)
        a few of those chance lows lined up for ``patience`` evaluations and fired on
        healthy fine-tunes. Higher fires less often on such runs but later (or never) on
        a noisy loss whose standard error approaches ``min_delta / margin``; lower reacts
        sooner to a stall in a noisy loss.
    early_points : int, default 20
        Finite points from which a run started from scratch is judged before its first
        full window (over all its points less the first fifth: a healthy run falls
        fastest there, so only one that has not learned at all looks flat). 0 waits for
        the first full window.
    span : float, default 2.0
        Width of the long window in windows (1 judges no long window). It is held to
        the same rate of fall, and a decelerating healthy loss falls more than ``span``
        times as much over it as over the window, so it is not more easily flat; but
        only a stall that has lasted about ``span`` windows reads flat over it. Longer
        judges noisier losses and needs a longer stall.
    span_patience : int, default 6
        Flat long windows in a row before firing. The long window's last third is
        ``span`` times the window's, so ``patience`` long windows in a row rest on
        fewer new points than ``patience`` windows: 4 fired on noise in healthy
        per-step fine-tunes of the suite; 6 renews three quarters of its last third at
        ``span`` 2 (7, all of it, missed some stalls the long window is there for).
    warning_share : float, default 0.5
        A plateau is a ``warning`` (posted) when, at detection, it has been flat for this
        share of the steps logged, else ``info`` (shown in status and answers). 0.5 is the
        real-corpus protocol's 'mild' plateau; lower posts the converged floors of healthy
        runs (issue 22: a quarter of the run on every healthy dev-half warning), higher
        posts only runs that never learned.
    eval_metric : str, default "eval/loss"
        The evaluation the frozen-model rule reads.
    frozen_evals : int, default 5
        Evaluations in a row with the same ``eval_metric`` value (to 1e-6 of it) that
        make a frozen model, reported as a plateau (0 turns the rule off). The value of a
        model whose weights change never repeats to six digits; fewer would catch a
        short repeat of one checkpoint's evaluation.

    *False-positive guard*: the trend is judged from medians of whole thirds of a long
    window, never from one point, so single outliers cannot make a falling run look flat.
    The standard error comes from each third's MAD; a window whose standard error is
    ``min_delta`` (the long window's: ``span * min_delta``) or more is too noisy to show a
    plateau and is not counted as flat (the error is widened for the loss's own step-to-step
    autocorrelation), so a per-batch loss whose noise dwarfs its trend neither fires nor
    flaps by chance (give such a loss a longer ``window``). A window that still falls by two
    standard errors (and by a quarter of ``min_delta``) is descending, however slowly, and
    never flat, unless it falls clearly slower than ``pace`` times the window before it
    (that earlier window must lie past the warm-up); with ``history`` this keeps a long
    run's power-law tail quiet. A healthy run that still falls just over ``min_delta`` per
    window is judged hundreds of times: ``margin`` asks the fall to stay under ``min_delta``
    by 1.5 standard errors, not one, so chance lows of a noisy window do not pass for flat.
    Each third's standard error is itself noisy, so one window can look flat by chance;
    ``patience`` asks for the verdict to hold until the window's last third has been
    (nearly) renewed, so it rests on new points. ``grace_period`` skips the warm-up (the
    early windows skip their first fifth, and are only judged on a run that starts from
    scratch: a resumed run continues a curve that may already be slow). The long window
    never counts as flat by ``pace`` (a power law decelerates more over longer windows),
    must lie past the warm-up, and asks ``span_patience`` evaluations; the resolve level
    (``2 * min_delta``) is wider than the firing one, so a borderline run does not flap.

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import RunData
    >>> rng = np.random.default_rng(0)
    >>> t = np.arange(600)
    >>> loss = 2.0 + 3.0 * np.exp(-t / 60) + 0.02 * rng.standard_normal(600)
    >>> [finding] = Plateau().detect(RunData.from_series("demo", {"train/loss": loss}))
    >>> finding.onset_step, finding.detected_step, finding.state
    (341, 470, 'firing')
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    train/loss has not improved over the last 100 points (steps 371–470):
    median 2.00 → 2.00 (+0.2%, less than the 1.0% fall required)
    """

    signal = "plateau"

    def __init__(self, metric: str = "train/loss", window: int = 100, min_delta: float = 0.01,
                 grace_period: int = 50, patience: int = 4, stride: int = 10,
                 history: float = 0.2, pace: float = 0.5, margin: float = 1.5,
                 early_points: int = 20, span: float = 2.0, span_patience: int = 6,
                 warning_share: float = 0.5, eval_metric: str = "eval/loss",
                 frozen_evals: int = 5) -> None:
        check_metric(metric)
        check_int("window", window, 6)
        check_real("history", history, 0.0, allow_equal=True, below=1.0)
        check_real("min_delta", min_delta, 0.0, below=1.0)
        check_real("pace", pace, 0.0, allow_equal=True, below=1.0)
        check_real("margin", margin, 0.0, allow_equal=True)
        check_int("grace_period", grace_period, 0)
        check_int("patience", patience, 1)
        check_int("stride", stride, 1)
        check_real("span", span, 1.0, allow_equal=True)
        check_int("span_patience", span_patience, 1)
        check_real("warning_share", warning_share, 0.0, allow_equal=True, below=1.0)
        check_metric(eval_metric, "eval_metric")
        if frozen_evals != 0:
            check_int("frozen_evals", frozen_evals, 3)
        if early_points != 0:
            check_int("early_points", early_points, 10)
        self.metric = metric
        self.window = window
        self.min_delta = min_delta
        self.grace_period = grace_period
        self.patience = patience
        self.stride = stride
        self.history = history
        self.pace = pace
        self.margin = margin
        self.early_points = early_points
        self.span = span
        self.span_patience = span_patience
        self.warning_share = warning_share
        self.eval_metric = eval_metric
        self.frozen_evals = frozen_evals
        self._streams: Streams[_State] = Streams()

    def detect(self, data: RunData) -> list[Finding]:
        series = data.series(self.metric)
        values = series.to_numpy(dtype=float)
        steps = series.index.to_numpy(dtype=np.int64)
        tags = (self.metric,)
        state = self._streams.resume(data, tags) or _State()
        self._advance(state, values, steps)
        self._streams.save(data, tags, state)
        first = int(steps[0]) if len(steps) else 0
        findings = [self._finding(data, e, first) for e in state.episodes]
        frozen = self._frozen(data, series)
        if frozen is not None and not any(  # one plateau: the window rule's, if it overlaps
                f.onset_step <= (math.inf if frozen.resolved_step is None
                                 else frozen.resolved_step)
                and (f.resolved_step is None or f.resolved_step >= frozen.onset_step)
                for f in findings):
            findings.append(frozen)
        return sorted(findings, key=lambda f: f.onset_step)

    def _frozen(self, data: RunData, train: pd.Series) -> Finding | None:
        """A model whose weights do not change: ``eval_metric`` the same value (to 1e-6
        of it) at ``frozen_evals`` evaluations in a row, while ``metric`` (when logged)
        does not fall clearly over them (a loss that falls means the evaluation was
        only repeated, e.g. carried forward on every row of a CSV export)."""
        evals = data.series(self.eval_metric).dropna()
        values = evals.to_numpy(dtype=float)
        n = self.frozen_evals
        if not n or len(values) < n:
            return None
        same = np.isclose(values[1:], values[:-1], rtol=1e-6, atol=0.0)
        counts = np.concatenate(([0], np.cumsum(same)))
        runs = np.flatnonzero(counts[n - 1:] - counts[:-(n - 1)] == n - 1)
        if not runs.size:
            return None
        start = int(runs[0])
        end = start + n - 1
        while end + 1 < len(values) and same[end]:
            end += 1
        steps = evals.index.to_numpy(dtype=np.int64)
        onset, detected = int(steps[start]), int(steps[start + n - 1])
        over = train[(train.index >= onset) & (train.index <= int(steps[end]))].dropna()
        if len(over) >= 6:
            third = len(over) // 3
            head = float(np.median(over.iloc[:third]))
            tail = float(np.median(over.iloc[-third:]))
            if head - tail > 2 * self.min_delta * abs(head):
                return None  # the loss falls: the evaluation was only repeated
        resolved = int(steps[end + 1]) if end + 1 < len(values) else None
        summary = (f"{self.eval_metric} was {fmt_number(float(values[start]))} at every one of "
                   f"the {end - start + 1} evaluations from step {onset} to step "
                   f"{int(steps[end])}: the weights are not changing (an LR of 0, frozen "
                   f"parameters, gradients that never arrive)")
        return self.finding(
            data, severity="warning", metric=self.metric if len(train) else self.eval_metric,
            onset_step=onset, detected_step=detected, summary=summary,
            evidence={"eval_metric": self.eval_metric, "value": float(values[start]),
                      "evaluations": end - start + 1,
                      "eval_steps": [onset, int(steps[end])]},
            resolved_step=resolved)

    def _advance(self, state: _State, values: np.ndarray, steps: np.ndarray) -> None:
        """Judge the windows that end in points logged since the last poll.

        Only the windows themselves are read (at most ``history`` of the run, judged every
        tenth of their width), so a poll's cost does not grow with the history."""
        positions = state.index.positions
        count = state.index.extend(values)
        if state.fresh is None and count >= max(2, self.early_points):
            state.fresh = _starts_from_scratch(steps)
        starts, widths = self._windows(count, bool(state.fresh))
        if state.evaluated >= len(starts):
            return
        new = slice(state.evaluated, None)
        ends = starts[new] + widths[new]
        # Each window is compared with the one of the same width just before it (when that
        # one lies past the warm-up): the run's own earlier pace.
        earlier = starts[new] - widths[new]
        has_earlier = earlier >= self.grace_period
        # The long window ends where the window ends and spans ``span`` times its width
        # (when that lies past the warm-up).
        long_widths = np.round(self.span * widths[new]).astype(np.int64)
        has_long = (ends - long_widths >= self.grace_period) & (self.span > 1)
        long_starts = np.where(has_long, ends - long_widths, starts[new])
        long_widths = np.where(has_long, long_widths, widths[new])
        lo = int(np.minimum(np.where(has_earlier, earlier, starts[new]), long_starts).min())
        hi = int(ends.max())
        at = positions(lo, hi)
        finite = values[at]
        evals = self._evaluate(finite, starts[new] - lo, widths[new])
        # A window whose noise could hide a fall of min_delta says nothing about a plateau;
        # one that falls by more than two standard errors (and a quarter of min_delta) is
        # still descending, however slowly: a long run's power-law tail is not a plateau,
        # unless its pace has clearly dropped below half the earlier window's (the tail of
        # a power law slows gradually; a stall cuts the pace at once). The earlier window
        # is only read where that can matter: where this one would be descending.
        slowed = np.zeros(len(ends), dtype=bool)
        paced = np.flatnonzero(has_earlier & self._descending(evals, self.min_delta))
        if paced.size:
            before = self._evaluate(finite, earlier[paced] - lo, widths[new][paced])
            slowed[paced] = (evals.improvement[paced] + evals.standard_error[paced]
                             < self.pace * (before.improvement - before.standard_error))
        flat, descending = self._flat(evals, self.min_delta, slowed)
        # The long window is held to the same rate of fall (span * min_delta over span times
        # the points) with the same confidence; its standard error is about 1/sqrt(span) of
        # the window's, so it can judge a loss too noisy for the window. It is judged only
        # where the window is not descending: a loss still falling clearly over the window
        # is no plateau, whatever a longer one says (and the long windows, with twice the
        # points, are the costliest to judge: a healthy run's are mostly skipped).
        required = self.span * self.min_delta
        judged_long = np.flatnonzero(has_long & ~descending)
        long = self._evaluate(finite, long_starts[judged_long] - lo, long_widths[judged_long])
        long_flat = np.zeros(len(ends), dtype=bool)
        long_flat[judged_long] = self._flat(long, required,
                                            np.zeros(len(judged_long), dtype=bool))[0]
        # Row of each evaluation in the long windows judged (those not judged are not flat).
        long_rows = np.full(len(ends), -1)
        long_rows[judged_long] = np.arange(len(judged_long))
        levels = ((flat.tolist(), evals, np.arange(len(ends)), self.min_delta, self.patience),
                  (long_flat.tolist(), long, long_rows, required, self.span_patience))
        falling = (evals.improvement - evals.standard_error >= 2 * self.min_delta).tolist()
        open_episode = (state.episodes[-1] if state.episodes
                        and state.episodes[-1].resolved_step is None else None)
        for j in range(len(ends)):
            if open_episode is not None:
                if falling[j]:
                    open_episode.resolved_step = int(steps[at[ends[j] - lo - 1]])
                    open_episode = None
                    state.flat_runs = [0, 0]
                continue
            for level, (flags, judged, rows, fall, patience) in enumerate(levels):
                if not flags[j]:
                    state.flat_runs[level] = 0
                    continue
                row = int(rows[j])
                start, width = int(judged.starts[row]), int(judged.widths[row])
                state.flat_runs[level] += 1
                if state.flat_runs[level] == 1:
                    state.run_start_steps[level] = int(steps[at[start]])
                if state.flat_runs[level] >= patience and open_episode is None:
                    band = np.percentile(finite[start:start + width], [10, 90])
                    open_episode = _Episode(state.run_start_steps[level], _Window(
                        (int(steps[at[start]]), int(steps[at[start + width - 1]])), width,
                        float(judged.first[row]), float(judged.last[row]),
                        float(judged.improvement[row]), float(judged.standard_error[row]), fall,
                        (float(band[0]), float(band[1]))))
                    state.episodes.append(open_episode)
        state.evaluated = len(starts)

    def _flat(self, evals: _Evaluations, required: float, slowed: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """Whether each window is flat: judged (its standard error under ``required``), not
        descending (a fall of two standard errors and a quarter of ``required``, unless it
        ``slowed``) and below ``required`` by ``margin`` standard errors; and whether it is
        descending."""
        descending = self._descending(evals, required) & ~slowed
        flat = ((evals.standard_error < required) & ~descending
                & (evals.improvement + self.margin * evals.standard_error < required))
        return flat, descending

    @staticmethod
    def _descending(evals: _Evaluations, required: float) -> np.ndarray:
        """Whether each window falls by two standard errors and a quarter of ``required``
        (before the earlier window's pace is weighed)."""
        return ((evals.improvement >= 2 * evals.standard_error)
                & (evals.improvement >= required / 4))

    def _windows(self, n: int, fresh: bool) -> tuple[np.ndarray, np.ndarray]:
        """Start and width of every judged window. A window spans ``window`` points, or
        ``history`` of the points logged so far when that is more (the loss of a long run
        falls along a power law: judged over a fixed number of points, its tail would look
        flat); windows that long are judged every tenth of their width. Before the first
        of them, a run that starts from scratch is judged from ``early_points`` on over all
        its points so far less their first fifth, every half ``stride``."""
        starts, widths = [], []
        end = self.grace_period + self.window
        if fresh and self.early_points:
            for early in range(self.early_points, min(end, n + 1), max(1, self.stride // 2)):
                starts.append(early // 5)
                widths.append(early - early // 5)
        while end <= n:
            width = max(self.window, min(int(self.history * end), end - self.grace_period))
            starts.append(end - width)
            widths.append(width)
            end += max(self.stride, width // 10) if width > self.window else self.stride
        return np.asarray(starts, dtype=np.int64), np.asarray(widths, dtype=np.int64)

    def _evaluate(self, values: np.ndarray, starts: np.ndarray,
                  widths: np.ndarray) -> _Evaluations:
        first, first_spread, last, last_spread, step_spread = (np.empty(len(starts))
                                                               for _ in range(5))
        steps = np.diff(values)
        for width in np.unique(widths):
            at = np.flatnonzero(widths == width)
            third = int(width) // 3
            first[at], first_spread[at] = _medians(values, starts[at], third)
            last[at], last_spread[at] = _medians(values, starts[at] + width - third, third)
            _, step_spread[at] = _medians(steps, starts[at] + width - third, third - 1)
        third = widths // 3
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            relative = (first - last) / np.abs(first)
            # Step-to-step autocorrelation (a per-step loss wanders: AR(1)-like) makes a
            # median of neighbours vary more than one of independent points. Its lag-1
            # coefficient follows from the spread of the differences against the spread of
            # the values, and widens the error by sqrt((1 + rho) / (1 - rho)).
            # (A spread of 0 over one of steps: no autocorrelation; both 0: a stuck loss.)
            ratio = np.where(last_spread > 0, step_spread / last_spread,
                             np.where(step_spread > 0, np.inf, 0.0))
            rho = np.clip(1 - ratio ** 2 / 2, 0.0, 0.9)
            inflation = np.sqrt((1 + rho) / (1 - rho))
            # One standard error of that ratio, from those of the two medians.
            error = (median_se(third) * inflation * np.hypot(first_spread, last_spread)
                     / np.abs(first))
        # From exactly zero a fall (or rise) is infinitely large: a rise is then never progress.
        from_zero = np.where(first == last, 0.0, np.copysign(np.inf, first - last))
        return _Evaluations(starts, widths, first, last,
                            np.where(first != 0, relative, from_zero),
                            np.where(first != 0, error, 0.0))

    def _finding(self, data: RunData, episode: _Episode, first_step: int) -> Finding:
        window = episode.fired
        first, last, gain = window.first, window.last, window.improvement
        change = f"{0.0 - 100 * gain:+.1f}%" if math.isfinite(gain) else "up from zero"
        summary = (f"{self.metric} has not improved over the last {window.width} points "
                   f"(steps {window.window_steps[0]}–{window.window_steps[1]}): median "
                   f"{fmt_number(first)} → {fmt_number(last)} ({change}, less than the "
                   f"{100 * window.required:.1f}% fall required)")
        # Flat for half the run when detected (the corpus protocol's 'mild' plateau; a
        # shorter window is 'borderline'): a warning. A shorter flat stretch late in a run
        # is most often its converged floor (issue 22: every plateau warning on the healthy
        # dev half was flat for a quarter of its run), so it is told, not posted.
        detected = window.window_steps[1]
        long = detected - episode.onset_step >= self.warning_share * (detected - first_step)
        return self.finding(
            data,
            severity="warning" if long else "info",
            onset_step=episode.onset_step,
            detected_step=window.window_steps[1],
            summary=summary,
            evidence={
                "window_steps": list(window.window_steps),
                "first_median": first,
                "last_median": last,
                "improvement": gain,
                "standard_error": window.standard_error,
                "min_delta": self.min_delta,
                "required_fall": window.required,
                "band": list(window.band),
            },
            resolved_step=episode.resolved_step,
        )


def _medians(values: np.ndarray, starts: np.ndarray,
             length: int) -> tuple[np.ndarray, np.ndarray]:
    """Median and robust standard deviation of ``values[s:s + length]`` for each start."""
    windows = sliding_window_view(values, length)
    rows = max(1, _CHUNK_ELEMENTS // length)
    medians, spreads = [], []
    for lo in range(0, len(starts), rows):
        chunk = windows[starts[lo:lo + rows]]
        median, spread = row_median_sd(chunk)
        medians.append(median)
        spreads.append(spread)
    return np.concatenate(medians), np.concatenate(spreads)



def _starts_from_scratch(steps: np.ndarray) -> bool:
    """Whether a series' first logged step lies within two logging intervals (the median
    of its first ten) of step 0: a fresh run, not one resumed from a checkpoint."""
    interval = float(np.median(np.diff(steps[:11]))) if len(steps) > 1 else 1.0
    return bool(steps[0] <= 2 * max(interval, 1.0))
