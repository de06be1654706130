"""Charts, list and compare over a real SQLite store and real matplotlib PNG bytes."""

import io
import json
import math
import struct
import time

import numpy as np
import pandas as pd
import pytest

from analyzers.base import Checkpoint
from analyzers.finding import Finding, Fix, RollbackTarget
from bot.alerting.notify import SendResult
from bot.alerting.outbox import Outbox
from bot.alerting.pipeline import reconcile
from bot.charts import (
    Chart,
    Line,
    StepMark,
    UnknownTag,
    compare_chart,
    draw,
    envelope,
    finding_chart,
    load_series,
    parse_step_range,
    resolve_tags,
    run_chart,
    split_nonfinite,
)
from bot.commands import handle_run_command
from bot.console import ConsoleNotifier, render_message
from bot.services.compare import SameRun, compare_runs, flatten, setting_changes
from bot.services.runs import list_runs
from bot.store import Store, UnknownRun

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk comes first
    return width, height


def ingest(store, run, rows, *, checkpoints=(), config=None, meta=None, now=None):
    frame = pd.DataFrame(rows, columns=["step", "tag", "value", "wall_time"])
    extra = dict(meta or {})
    if config is not None:
        extra["config"] = config
    return store.ingest(run=run, source="file", log_path=f"{run}.jsonl", cursor_key=run,
                        cursor={"offset": len(rows)}, points=frame,
                        checkpoints=[Checkpoint(s, f"{run}/checkpoint-{s}") for s in checkpoints],
                        meta=extra, malformed=[], skipped_values=0, notices=[], now=now)


def training(steps, *, start=1, spike_at=None, nan_at=None, lr=3e-4, t0=None, eval_every=50):
    t0 = time.time() - steps if t0 is None else t0
    rows = []
    for s in range(start, start + steps):
        loss = 2.0 + 1.0 / s
        if s == spike_at:
            loss = 25.0
        if s == nan_at:
            loss = math.nan
        wall = t0 + s
        rows += [(s, "train/loss", loss, wall), (s, "lr", lr, wall),
                 (s, "grad_norm", 1.0 + (s % 7) / 10 + (99.0 if s == spike_at else 0.0), wall),
                 (s, "throughput", 1e5, wall), (s, "gpu_mem", 40.0, wall)]
        if s % eval_every == 0:
            rows.append((s, "eval/loss", 2.1 + 1.0 / s, wall))
    return rows


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "rw.db"))
    yield s
    s.close()


# -- downsampling -----------------------------------------------------------------------------


def test_envelope_keeps_a_one_step_spike_and_the_ends():
    steps = np.arange(1_000_000)
    values = np.sin(steps / 5000.0)
    values[654_321] = 50.0
    values[123_456] = -40.0
    xs, ys = envelope(steps, values, max_points=2000)
    assert len(xs) <= 2002
    assert ys.max() == 50.0 and xs[ys.argmax()] == 654_321
    assert ys.min() == -40.0 and xs[ys.argmin()] == 123_456
    assert xs[0] == 0 and xs[-1] == 999_999
    assert np.all(np.diff(xs) > 0)  # still in step order


@pytest.mark.parametrize("n", [2001, 2499, 2999, 3001, 100_003])
def test_envelope_buckets_fit_any_length(n):
    steps = np.arange(n)
    xs, ys = envelope(steps, steps * 1.0, max_points=2000)
    assert len(xs) <= 2002 and xs[0] == 0 and xs[-1] == n - 1


def test_short_series_are_drawn_as_they_are():
    steps, values = np.arange(10), np.arange(10.0)
    xs, ys = envelope(steps, values, max_points=2000)
    assert (xs == steps).all() and (ys == values).all()


def test_nonfinite_points_are_kept_as_markers_never_dropped():
    steps = np.arange(100_000)
    values = np.ones(100_000)
    values[[10, 50_000]] = math.nan
    values[70_000] = math.inf
    xs, ys, bad = split_nonfinite(steps, values)
    assert np.isfinite(ys).all() and len(xs) == 100_000 - 3
    assert list(bad["NaN"]) == [10, 50_000] and list(bad["inf"]) == [70_000]
    assert "-inf" not in bad


def test_a_long_nonfinite_run_is_thinned_not_lost():
    values = np.full(500_000, math.nan)
    _, _, bad = split_nonfinite(np.arange(500_000), values, max_points=1000)
    assert 1 <= len(bad["NaN"]) <= 1000 and bad["NaN"][0] == 0


# -- drawing ----------------------------------------------------------------------------------


def test_draw_gives_deterministic_png_bytes_sized_by_panels():
    steps = np.arange(1, 501)
    chart = Chart("exp1 · attempt 1", [
        Line("train/loss", steps, 2 + 1 / steps, "train/loss", "#1f77b4"),
        Line("grad_norm", steps, 1 + steps % 5, "grad_norm", "#d62728")],
        checkpoints=[100, 200], marks=[StepMark(300, "onset", "onset (step 300)")])
    first, second = draw(chart), draw(chart)
    assert first == second
    width, height = png_size(first)
    assert width == 1100 and 300 < height < 600  # two panels
    three = draw(Chart("x", chart.lines + [Line("lr", steps, steps * 1e-6, "lr", "#2ca02c")]))
    assert png_size(three)[1] > height


def test_draw_refuses_an_empty_chart_but_draws_a_series_of_only_nan():
    with pytest.raises(ValueError, match="nothing to draw"):
        draw(Chart("empty", []))
    only_bad = Line("train/loss", np.arange(3), np.array([math.nan, math.inf, -math.inf]),
                    "train/loss", "#1f77b4")
    assert draw(Chart("diverged", [only_bad]))[:8] == PNG_SIGNATURE


def test_a_million_point_run_draws_in_well_under_a_few_seconds():
    n = 200_000
    steps = np.arange(1, n + 1)
    rng = np.random.default_rng(0)
    loss = 2 + 1 / np.sqrt(steps) + 0.01 * rng.standard_normal(n)
    loss[150_000] = math.nan
    lines = [Line(tag, steps, loss * k, tag, "#1f77b4")
             for k, tag in enumerate(("train/loss", "lr", "grad_norm", "throughput", "gpu_mem"),
                                     start=1)]
    draw(Chart("warm", lines[:1]))  # the first draw imports matplotlib and loads fonts
    started = time.perf_counter()
    png = draw(Chart("exp1 · 1M points", lines, checkpoints=range(0, n, 1000)))
    assert time.perf_counter() - started < 3.0
    assert png[:8] == PNG_SIGNATURE


# -- loading from the store -------------------------------------------------------------------


def test_loader_splits_attempts_and_keeps_nan_from_sqlite(store):
    ingest(store, "exp1", training(60, nan_at=40), checkpoints=[20, 40])
    ingest(store, "exp1", training(30, start=21))  # went back: attempt 2
    data = load_series(store, "exp1", ["train/loss"])
    assert data.attempt == 2 and sorted(data.series) == [1, 2]
    steps, values = data.series[1]["train/loss"]
    assert len(steps) == 60 and math.isnan(values[list(steps).index(40)])
    assert list(data.series[2]["train/loss"][0][[0, -1]]) == [21, 50]
    assert data.checkpoints == [20, 40]
    only = load_series(store, "exp1", attempts="current")
    assert list(only.series) == [2]
    with pytest.raises(UnknownRun, match="known runs: exp1"):
        load_series(store, "nope")


def test_long_series_are_reduced_in_sqlite_keeping_spikes_and_nonfinite_points(store):
    n = 20_000
    rows = [(s, "train/loss", 2.0 + (s % 10) / 100, None) for s in range(1, n + 1)]
    rows[12_344] = (12_345, "train/loss", 30.0, None)
    rows[15_000] = (15_001, "train/loss", math.nan, None)
    rows[16_000] = (16_001, "train/loss", math.inf, None)
    rows[17_000] = (17_001, "train/loss", -5.0, None)
    ingest(store, "exp1", rows)
    steps, values = load_series(store, "exp1", max_points=500).series[1]["train/loss"]
    assert len(steps) <= 520 and (steps[0], steps[-1]) == (1, n)
    finite = np.isfinite(values)
    assert values[finite].max() == 30.0 and steps[finite][values[finite].argmax()] == 12_345
    assert values[finite].min() == -5.0 and steps[finite][values[finite].argmin()] == 17_001
    assert list(steps[np.isnan(values)]) == [15_001]
    assert list(steps[np.isposinf(values)]) == [16_001]
    full_steps, _ = load_series(store, "exp1", max_points=None).series[1]["train/loss"]
    assert len(full_steps) == n


def test_run_chart_draws_only_panels_with_data(store):
    ingest(store, "exp1", [(s, "train/loss", 2.0 + 1 / s, None) for s in range(1, 101)])
    one = run_chart(store, "exp1")
    assert one.extra["tags"] == ["train/loss"] and one.extra["step"] == 100
    ingest(store, "exp2", training(100))
    six = run_chart(store, "exp2")
    assert six.extra["tags"] == ["train/loss", "eval/loss", "lr", "grad_norm", "throughput",
                                 "gpu_mem"]
    assert png_size(six.png)[1] > png_size(one.png)[1] * 2  # five panels against one
    assert one.filename == "exp1-attempt1-step100.png"


def test_tags_resolve_by_name_short_name_and_prefix():
    known = ["train/loss", "eval/loss", "lr", "eval/general/accuracy", "eval/general/f1"]
    assert resolve_tags("r", ["loss", "val", "LR"], known) == ["train/loss", "eval/loss", "lr"]
    assert resolve_tags("r", ["eval/general/"], known) == ["eval/general/accuracy",
                                                           "eval/general/f1"]
    with pytest.raises(UnknownTag, match="r has no metric 'gpu_mem', 'bogus'; its metrics: "):
        resolve_tags("r", ["gpu_mem", "bogus"], known)


def test_step_ranges():
    assert parse_step_range("100-200") == (100, 200)
    assert parse_step_range("100-") == (100, None)
    assert parse_step_range("-200") == (None, 200)
    assert parse_step_range("200-100") is None
    assert parse_step_range("loss") is None and parse_step_range("-") is None


def test_finding_chart_marks_onset_detection_rollback_and_earlier_attempts(store):
    ingest(store, "exp1", training(80, spike_at=60), checkpoints=[25, 50, 75])
    ingest(store, "exp1", training(40, start=51))
    finding = Finding(run="exp1", signal="spike", severity="critical", metric="train/loss",
                      onset_step=60, detected_step=62, summary="loss jumped",
                      evidence={"peak": 25.0}, fixes=[], kind="not_learning",
                      source="000 §3.2", rollback_to=RollbackTarget(50, "exp1/checkpoint-50",
                                                                    "last before the onset"))
    chart = finding_chart(store, finding.to_dict())
    assert chart.title == "exp1 · attempt 1 · spike from step 60"
    assert chart.filename.startswith("exp1-spike-step60-")
    assert png_size(chart.png)[0] == 1100
    # the same chart from the stored row shape (JSON in `data`)
    row = {"data": json.dumps(finding.to_dict())}
    assert finding_chart(store, row).png == chart.png


# -- compare and list -------------------------------------------------------------------------


def test_flatten_and_setting_changes():
    a = flatten({"optimizer": {"lr": 3e-4, "betas": [0.9, 0.95]}, "epochs": 3, "seed": 1})
    b = flatten({"optimizer": {"lr": 1e-3, "betas": [0.9, 0.95]}, "epochs": 3, "warmup": 500})
    assert a["optimizer.lr"] == 3e-4 and a["optimizer.betas"] == [0.9, 0.95]
    changes = setting_changes(a, b)
    assert [(c.key, c.kind) for c in changes] == [("optimizer.lr", "changed"),
                                                   ("seed", "removed"), ("warmup", "added")]


def test_compare_counts_settings_and_reads_metrics_at_equal_steps(store):
    ingest(store, "base", training(200, eval_every=50),
           config={"optimizer": {"lr": 3e-4}, "epochs": 3}, meta={"data_version": "v1"})
    ingest(store, "exp2", training(120, eval_every=25, lr=1e-3),
           config={"optimizer": {"lr": 1e-3}, "epochs": 3}, meta={"data_version": "v1"})
    c = compare_runs(store, "base", "exp2")
    assert c.changed_count == 1 and c.one_variable
    assert c.common_step == 120
    loss = next(p for p in c.at_steps if p.tag == "train/loss")
    assert loss.step == 120 and loss.first == loss.second == pytest.approx(2 + 1 / 120)
    lr = next(p for p in c.at_steps if p.tag == "lr")
    assert lr.change == pytest.approx(1e-3 / 3e-4 - 1)
    assert [p.step for p in c.at_steps if p.tag == "eval/loss"] == [100]  # both evaluated
    assert c.best_eval["base"].step == 200 and c.best_eval_common["base"].step == 100
    assert c.best_eval["exp2"].step == 100

    ingest(store, "exp3", training(50), config={"optimizer": {"lr": 1e-3}, "epochs": 5},
           meta={"data_version": "v2"})
    c3 = compare_runs(store, "base", "exp3")
    assert c3.changed_count == 3 and not c3.one_variable
    reply = handle_run_command("compare base exp3", store)
    assert reply.kind == "upload"
    assert "3 settings differ" in reply.text and "change one variable at a time" in reply.text
    assert "`data_version`: v1 → v2" in reply.text
    assert png_size(reply.data["png"])[0] == 1100
    assert reply.data["comment"].startswith("base vs exp3: :warning: 3 settings differ")

    with pytest.raises(SameRun):
        compare_runs(store, "base", "base")
    with pytest.raises(UnknownRun):
        compare_runs(store, "base", "nope")


def test_compare_of_runs_without_metrics_still_compares_settings(store):
    ingest(store, "a", [], config={"lr": 1})
    ingest(store, "b", [], config={"lr": 2})
    assert compare_chart(store, "a", "b") is None
    reply = handle_run_command("compare a b", store)
    assert reply.kind == "compare" and "1 setting differs" in reply.text
    assert "no metric logged at a common step" in reply.text


def test_list_shows_active_runs_worst_first_with_one_line_each(store):
    now = time.time()
    ingest(store, "calm", training(30, t0=now - 30), meta={"total_steps": 100})
    ingest(store, "hot", training(40, t0=now - 40), meta={"total_steps": 100})
    ingest(store, "done", training(20, t0=now - 20), meta={"total_steps": 20})
    findings = [Finding(run="hot", signal="spike", severity="critical", metric="train/loss",
                        onset_step=35, detected_step=35, summary="loss jumped", evidence={},
                        fixes=[Fix("Roll back", "000 §3.2", "rollback")], kind="not_learning",
                        source="000 §3.2"),
                Finding(run="hot", signal="plateau", severity="warning", metric="train/loss",
                        onset_step=10, detected_step=30, summary="flat", evidence={},
                        fixes=[], kind="not_learning", source="000 §3.1")]
    reconcile(store, "hot", 1, findings, signals={"spike", "plateau"}, channel="#a", now=now)
    runs = list_runs(store, now=now)
    assert [r.run for r in runs.active] == ["hot", "calm"] and runs.finished == 1
    hot = runs.active[0]
    assert (hot.open_alerts, hot.worst_severity, hot.step) == (2, "critical", 40)
    reply = handle_run_command("list", store)
    lines = reply.text.splitlines()
    assert lines[0] == "Active runs: 2, 1 with open alerts"
    assert lines[1].startswith(":rotating_light: *hot* running · step 40/100 (40%) · loss 2.025")
    assert "2 open alerts (worst critical)" in lines[1] and "last point" in lines[1]
    assert "no open alerts" in lines[2]
    assert "1 finished run not listed" in lines[-1]


# -- commands ---------------------------------------------------------------------------------


def test_plot_command_answers_bad_input_in_one_line(store):
    ingest(store, "exp1", training(30))
    reply = handle_run_command("plot exp1 loss grad_norm 5-25", store)
    assert reply.kind == "upload" and reply.data["png"][:8] == PNG_SIGNATURE
    assert "train/loss, grad_norm" in reply.text
    assert handle_run_command("plot nope", store).text == \
        "unknown run 'nope'; known runs: exp1"
    bad = handle_run_command("plot exp1 bogus", store)
    assert bad.kind == "error" and bad.text.startswith("exp1 has no metric 'bogus'; its metrics:")
    assert handle_run_command("plot exp1 500-900", store).text == \
        "exp1 has no points in steps 500-900; its steps run 1-30"
    ingest(store, "empty", [])
    assert handle_run_command("plot empty", store).text == \
        "empty has no metrics yet; nothing to plot"
    ingest(store, "odd", [(1, "reward", 0.5, None)])
    assert handle_run_command("plot odd", store).text == (
        "odd has none of the default metrics; name some, e.g. `/run plot odd reward` "
        "(its metrics: reward)")
    assert handle_run_command("plot odd reward", store).kind == "upload"
    assert handle_run_command("plot", store).kind == "help"
    assert handle_run_command("compare exp1", store).kind == "help"
    assert handle_run_command("compare exp1 exp1", store).text == \
        "`/run compare` needs two different runs; got exp1 twice"
    assert "`/run plot RUN" in handle_run_command("help", store).text


def test_console_saves_the_chart_and_prints_its_path(store, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    ingest(store, "exp1", training(30))
    from rich.console import Console

    out = Console(file=io.StringIO(), width=200)
    out.print(render_message(handle_run_command("plot exp1", store)))
    text = out.file.getvalue()
    saved = tmp_path / "runwatch-charts" / "exp1-attempt1-step30.png"
    assert f"chart saved to {saved}" in text.replace("\n", "")
    assert saved.read_bytes()[:8] == PNG_SIGNATURE


class Recording(ConsoleNotifier):
    def __init__(self, tmp_path, fail_uploads=()):
        super().__init__(chart_dir=tmp_path / "charts")
        self.uploads = []
        self.failures = list(fail_uploads)

    def post(self, channel, message, thread_ts=None):
        return SendResult(True, channel=channel, ts=f"9.{len(self.uploads)}")

    def upload(self, channel, thread_ts, filename, data, title, comment=None):
        self.uploads.append((channel, thread_ts, filename, data[:8]))
        if self.failures:
            return self.failures.pop(0)
        return super().upload(channel, thread_ts, filename, data, title, comment)


def spike_finding():
    return Finding(run="exp1", signal="spike", severity="critical", metric="train/loss",
                   onset_step=40, detected_step=40, summary="loss NaN at step 40",
                   evidence={"peak": math.nan}, fixes=[Fix("Roll back", "000 §3.2", "rollback")],
                   kind="not_learning", source="000 §3.2")


def test_an_alert_is_posted_then_its_chart_goes_into_its_thread(store, tmp_path):
    ingest(store, "exp1", training(45, nan_at=40))
    reconcile(store, "exp1", 1, [spike_finding()], signals={"spike"}, channel="#a", now=0.0)
    notifier = Recording(tmp_path)
    assert Outbox(store, notifier, clock=lambda: 100.0).dispatch() == 1
    [(channel, thread, filename, head)] = notifier.uploads
    assert (channel, thread, head) == ("#a", "9.0", PNG_SIGNATURE)
    assert (tmp_path / "charts" / filename).exists()
    assert [r["kind"] for r in store.query("SELECT kind FROM outbox")] == ["alert"]


def test_a_failed_chart_is_retried_without_holding_back_the_queue(store, tmp_path):
    ingest(store, "exp1", training(45, nan_at=40))
    now = [0.0]
    reconcile(store, "exp1", 1, [spike_finding()], signals={"spike"}, channel="#a", now=now[0])
    notifier = Recording(tmp_path, [SendResult(False, True, "Slack answered 503")])
    outbox = Outbox(store, notifier, clock=lambda: now[0])
    assert outbox.dispatch() == 1  # the alert went out; its chart did not
    rows = store.query("SELECT kind, state, attempts FROM outbox ORDER BY id")
    assert rows == [{"kind": "alert", "state": "sent", "attempts": 0},
                    {"kind": "chart", "state": "pending", "attempts": 1}]
    reconcile(store, "exp1", 1, [spike_finding().__class__(**{
        **spike_finding().__dict__, "state": "resolved", "resolved_step": 44})],
        signals={"spike"}, channel="#a", now=now[0])
    outbox.dispatch()
    states = {r["kind"]: r["state"] for r in store.query("SELECT kind, state FROM outbox")}
    assert states["resolved"] == "sent"  # not held back by the chart waiting for its retry
    assert states["chart"] == "pending" and len(notifier.uploads) == 1
    now[0] += 10
    assert outbox.dispatch() == 1
    assert len(notifier.uploads) == 2 and notifier.uploads[1][1] == "9.0"
    assert {r["state"] for r in store.query("SELECT state FROM outbox")} == {"sent"}


def test_a_chart_that_cannot_be_drawn_costs_nothing(store, tmp_path):
    # a finding on a run with no stored metrics: the alert goes out, the chart is left out
    reconcile(store, "ghost", 1, [Finding(**{**spike_finding().__dict__, "run": "ghost"})],
              signals={"spike"}, channel="#a", now=0.0)
    notifier = Recording(tmp_path)
    assert Outbox(store, notifier, clock=lambda: 100.0).dispatch() == 1
    assert notifier.uploads == []
    assert [r["kind"] for r in store.query("SELECT kind FROM outbox")] == ["alert"]
