"""`runwatch bench detect`: the labelled generator, the event-level scorer, the peer
baselines and a small suite end to end."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from analyzers import RunData
from benchmarks.detect import (
    BASELINES,
    corpus_cases,
    corpus_labels,
    detection_tables,
    early_stopping,
    evaluate,
    foundry_kill_loss_spike,
    lightning_spike_detection,
    markdown_section,
    match,
    megatron_checks,
    olmo_stability,
    score,
    summarise,
    target_misses,
    wandb_zscore,
    write_section,
)
from benchmarks.synthetic import FOREVER, Case, Detection, Event, synthetic_suite
from tests.corpus import CORPUS


def frames_equal(a: RunData, b: RunData) -> bool:
    return a.metrics.equals(b.metrics) and a.checkpoints == b.checkpoints and a.meta == b.meta


def test_the_generator_is_deterministic_for_a_seed() -> None:
    one = synthetic_suite(seed=3, repeats=1, signals=["spike", "overfit"])
    two = synthetic_suite(seed=3, repeats=1, signals=["spike", "overfit"])
    other = synthetic_suite(seed=4, repeats=1, signals=["spike", "overfit"])
    assert [c.name for c in one] == [c.name for c in two]
    assert all(frames_equal(a.data, b.data) and a.events == b.events
               for a, b in zip(one, two, strict=True))
    assert not all(frames_equal(a.data, b.data) for a, b in zip(one, other, strict=True))


def test_labels_are_where_the_injection_is() -> None:
    cases = {c.name: c for c in synthetic_suite(seed=0, repeats=1,
                                                signals=["spike", "lr_schedule", "memory"])}
    for name, case in cases.items():
        loss = case.data.series("train/loss")
        for event in case.events:
            if event.variant == "finite":
                before = loss[loss.index < event.onset].iloc[-20:].median()
                assert loss[event.onset] > 1.5 * before, name
            elif event.variant == "nan/inf":
                assert not np.isfinite(loss[event.onset]), name
                assert np.isfinite(loss[loss.index < event.onset]).all(), name
            elif event.signal == "memory" and event.variant == "near capacity":
                mem = case.data.series("gpu_mem")
                assert mem[event.onset] >= 0.95 * 80
                assert (mem[mem.index < event.onset] < 0.95 * 80).all()
    lr_case = cases["lr_schedule/off schedule/doubled/0"]
    [event] = lr_case.events
    lr = lr_case.data.series("lr")
    prev = lr.index[lr.index.get_loc(event.onset) - 1]
    assert lr[event.onset] / lr[prev] > 1.9  # the LR doubles exactly at the label


def events(*onsets: int, tolerance: int = 10) -> list[Event]:
    return [Event("spike", onset, tolerance) for onset in onsets]


def test_a_detection_inside_the_window_is_a_hit_with_its_delay() -> None:
    result = match(events(100), [103])
    assert (result["tp"], result["fp"], result["delays"]) == (1, 0, [3])


def test_the_tolerance_edge_is_inside_and_one_past_it_is_not() -> None:
    assert match(events(100), [110])["delays"] == [10]
    late = match(events(100), [111])
    assert (late["tp"], late["fp"], late["delays"]) == (0, 1, [None])


def test_a_second_detection_of_the_same_event_is_a_false_positive() -> None:
    result = match(events(100), [100, 104])
    assert (result["tp"], result["fp"], result["duplicates"]) == (1, 1, 1)
    assert result["delays"] == [0]


def test_a_detection_before_the_onset_is_a_false_positive_and_no_hit() -> None:
    result = match(events(100), [99])
    assert (result["tp"], result["fp"], result["early"], result["delays"]) == (0, 1, 1, [None])
    # ... and the event can still be matched by a later detection
    result = match(events(100), [99, 101])
    assert (result["tp"], result["fp"], result["delays"]) == (1, 1, [1])


def test_two_events_are_matched_each_once_and_allowed_detections_are_not_scored() -> None:
    result = match(events(100, 105), [101, 106, 300], [(200, 10**12)])
    assert (result["tp"], result["fp"], result["delays"]) == (2, 0, [1, 1])
    assert match(events(100), [300])["fp"] == 1


def test_one_detection_per_allowed_stretch_is_excused_a_repeat_is_a_false_positive() -> None:
    """A finding that is true in a stretch (from a consequence's onset, or where a healthy
    run has converged) is excused once per stretch; firing again inside the same stretch
    is flapping, a false positive; one outside every stretch is a plain false positive."""
    result = match(events(100), [101, 300, 400, 500], [(200, 10**12)])
    assert (result["tp"], result["fp"], result["duplicates"]) == (1, 2, 2)
    # Two stretches (a multi-epoch run converges within each epoch): one each.
    assert match([], [250, 650], [(200, 300), (600, 700)])["fp"] == 0
    assert match([], [250, 280, 450], [(200, 300), (600, 700)])["fp"] == 2


def test_the_healthy_runs_excuse_plateau_and_diminishing_returns_by_their_own_rules() -> None:
    """Where a healthy run has converged a plateau or diminishing_returns finding is true:
    in the stretches where the noise-free curve meets that analyzer's own rule, and
    nowhere else (the rule's thresholds, not looser ones); within the attempt analysed."""
    from benchmarks.synthetic import PROFILES, _converged, _flat, base_run
    run = base_run(np.random.default_rng(5), PROFILES[0], "cosine")
    clean, steps = run.clean_eval(), run.eval_steps
    gains = (clean[:-1] - clean[1:]) / clean[:-1]  # gains[k - 1]: evaluation k
    met, reference = [], 0  # 3 in a row under 0.5% each, or not 0.5% below the reference
    for k in range(1, len(clean)):
        if clean[k] <= clean[reference] * (1 - 0.005):
            reference = k
        if k - reference >= 3 or (k >= 3 and (gains[k - 3:k] < 0.005).all()):
            met.append(k)
    stretches = _converged(run)
    assert stretches and met
    assert [k for k in range(len(steps))
            if any(lo <= steps[k] < hi for lo, hi in stretches)] == met
    loss = run.clean_loss()
    end = int(np.searchsorted(run.steps, _flat(run)[0][0])) + 1  # points in the window
    width = max(100, int(0.2 * end))
    first, last = loss[end - width + width // 6], loss[end - 1 - width // 6]
    assert (first - last) / first < 0.01
    # Within a resumed attempt: nothing is judged before its own grace period and window.
    middle = len(run.steps) // 2
    later = _flat(run, start=int(run.steps[middle]))
    assert not later or later[0][0] >= int(run.steps[middle + 150])


def test_every_checkpoint_gap_case_can_be_seen() -> None:
    """At least two saves before the stop (the interval is known), and the run goes on for
    longer than the default limit past the last save (the gap can be seen at all)."""
    for case in synthetic_suite(seed=1, repeats=4, signals=["checkpoint_gap"]):
        if not case.name.startswith("checkpoint_gap/"):
            continue
        saves = [c.step for c in case.data.checkpoints]
        interval = saves[1] - saves[0]
        assert len(saves) >= 2
        assert case.steps >= saves[-1] + max(3 * interval, 1000) + interval, case.name


def test_false_alarm_rate_counts_only_controls_that_carry_the_signals_input() -> None:
    """A text signal can raise nothing on a run without generations: its false alarms per
    10k steps are over the negative controls that log generations, not over all of them."""
    plain = RunData.from_series("p", {"train/loss": [1.0, 0.9]})
    texts = RunData.from_series("t", {"train/loss": [1.0, 0.9]}, generations=[
        {"step": 10, "prompt": "p", "output": "o"}])
    cases = [Case("plain", plain, [], 30_000, negative=True),
             Case("texts", texts, [], 10_000, negative=True)]
    found = {"texts": [Detection("repetition", 10), Detection("spike", 10)]}
    per_signal, _, negative_steps = score(cases, found, ["repetition", "spike"])
    assert negative_steps == 40_000
    assert summarise(per_signal["repetition"])["false_alarms_per_10k"] == 1.0
    assert summarise(per_signal["spike"])["false_alarms_per_10k"] == 0.25


def test_precision_recall_f1_delay_and_false_alarms() -> None:
    data = RunData.from_series("x", {"train/loss": [1.0]})
    cases = [Case("a", data, events(100, 500), 1000),
             Case("b", data, events(100), 1000),
             Case("neg", data, [], 10_000, negative=True)]
    found = {"a": [Detection("spike", 102), Detection("spike", 520)],
             "b": [Detection("spike", 100), Detection("spike", 104)],
             "neg": [Detection("spike", 7)]}
    [per_signal, _, negative_steps] = score(cases, found, ["spike"])
    s = summarise(per_signal["spike"])
    assert negative_steps == 10_000
    # a: 102 hit, 520 late (FP, event missed); b: 100 hit, 104 duplicate; neg: 1 FP.
    assert (s["events"], s["tp"], s["fp"], s["duplicates"]) == (3, 2, 3, 1)
    assert s["precision"] == pytest.approx(2 / 5)
    assert s["recall"] == pytest.approx(2 / 3)
    assert s["f1"] == pytest.approx(2 * 0.4 * (2 / 3) / (0.4 + 2 / 3))
    assert (s["median_delay_steps"], s["false_alarms_per_10k"]) == (1.0, 1.0)


def obvious_spike() -> np.ndarray:
    rng = np.random.default_rng(0)
    loss = 2.0 + 0.02 * rng.standard_normal(400)
    loss[300] = 30.0
    return loss


@pytest.mark.parametrize("rule", [olmo_stability, lightning_spike_detection, megatron_checks])
def test_the_spike_baselines_fire_on_an_obvious_spike(rule) -> None:
    assert np.flatnonzero(rule(obvious_spike())).tolist() == [300]


def test_the_wandb_zscore_fires_on_the_spike_and_on_3_sigma_noise() -> None:
    flagged = np.flatnonzero(wandb_zscore(obvious_spike())).tolist()
    assert 300 in flagged and len(flagged) > 1  # 3σ over 30 points also catches noise


def test_kill_loss_spike_needs_more_than_patience_outliers_in_a_row() -> None:
    loss = obvious_spike()
    assert not foundry_kill_loss_spike(loss).any()
    loss[300:306] = 30.0  # the fifth outlier in a row (counter 5 > patience 4) fires
    assert np.flatnonzero(foundry_kill_loss_spike(loss)).tolist() == [304, 305]


def test_non_finite_values_in_the_baselines() -> None:
    loss = obvious_spike()
    loss[200] = np.nan
    assert megatron_checks(loss)[200] and lightning_spike_detection(loss)[200]
    assert not olmo_stability(loss)[200]  # NaN > threshold is false: OLMo's rule misses it


def test_early_stopping_stops_after_patience_checks_without_improvement() -> None:
    assert early_stopping(np.array([3.0, 2.0, 1.5, 1.6, 1.5, 1.7])) == 5
    assert early_stopping(np.array([3.0, 2.0, 1.0])) is None


def test_an_early_stop_on_a_non_finite_loss_is_no_plateau_or_overfit() -> None:
    """Lightning's check_finite stops on NaN: that stop says the loss blew up, not that it
    stopped improving, so the EarlyStopping baseline reports no plateau/overfit there."""
    from benchmarks.detect import BASELINES
    detect = BASELINES["EarlyStopping p=3"][1]
    steps = np.arange(1, 1001)
    loss = 3.0 - steps / 1000
    evals = pd.Series(2.0 - np.arange(10) / 10, index=np.arange(100, 1001, 100))
    clean = RunData.from_series("r", {"train/loss": loss, "eval/loss": evals}, steps=steps)
    assert detect(clean) == []
    loss[450] = np.nan
    evals.iloc[5] = np.nan
    broken = RunData.from_series("r", {"train/loss": loss, "eval/loss": evals}, steps=steps)
    assert detect(broken) == []


def test_every_baseline_runs_on_run_data() -> None:
    steps = np.arange(1, 401)
    data = RunData.from_series("x", {"train/loss": obvious_spike(),
                                     "eval/loss": pd.Series([2.0, 1.9, 2.0, 2.1, 2.2],
                                                            index=[80, 160, 240, 320, 400])},
                               steps=steps)
    for name, (covered, detector) in BASELINES.items():
        found = detector(data)
        assert {d.signal for d in found} <= covered, name
    assert Detection("spike", 301) in BASELINES["Megatron NaN + 10x"][1](data)
    assert Detection("overfit", 400) in BASELINES["EarlyStopping p=3"][1](data)


def test_a_small_suite_end_to_end(tmp_path) -> None:
    cases = synthetic_suite(seed=0, repeats=1, signals=["spike", "throughput_drop",
                                                        "negative"])
    result = evaluate(cases)
    spike = result.ours["spike"]
    # Three strengths × two spikes, three NaN/Inf kinds, three strengths of a held spike.
    assert spike["events"] == 3 * 2 + 3 + 3
    assert spike["recall"] >= 0.9
    assert result.variants[("spike", "sustained")]["recall"] == 1.0
    # llm-foundry's rule (more than 4 points at twice the mean) sees only a held spike.
    foundry = result.baselines["llm-foundry KillLossSpike"]["spike"]
    assert foundry["tp"] >= 1 and foundry["fp"] == 0
    assert result.variants[("spike", "nan/inf")]["recall"] == 1.0
    assert result.variants[("spike", "nan/inf")]["median_delay_steps"] == 0
    assert result.ours["throughput_drop"]["recall"] == 1.0
    assert set(result.baselines) == set(BASELINES)
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    write_section(out, markdown_section(result, None, "runwatch bench detect"))
    write_section(out, markdown_section(result, None, "runwatch bench detect"))
    text = out.read_text()
    assert text.count("## Detection") == 1 and "kept" in text
    assert "| spike | runwatch |" in text and "Megatron NaN + 10x" in text
    # The time each analyzer took over the suite: the three slowest are named.
    assert set(result.analyzer_seconds) >= {"spike", "throughput_drop"}
    assert re.search(r"slowest analyzers: (\w+ \d+\.\d s, ){2}\w+ \d+\.\d s\)", text)
    # The oracle's table: what any detector could reach where a delay target is missed.
    assert "What any detector could reach" in text
    assert re.search(r"\| plateau \| .* \| ≤ 2 % of the run \| \d+\.\d / \d+\.\d % of "
                     r"the run \| 0% \|", text)


def test_the_corpus_labels_are_well_formed() -> None:
    labels = corpus_labels()
    files = [entry["file"] for entry in labels]
    assert len(files) == len(set(files))
    for entry in labels:
        assert entry["verdict"] in ("problems", "no visible problem")
        for event in entry.get("event", []):
            assert event["signal"] and event["reason"]
            assert event["tolerance"] >= 0 and isinstance(event["onset"], int)
        for stretch in entry.get("allow", []):
            assert stretch["signal"] not in entry.get("allowed", [])  # the whole run already
            assert 0 <= stretch["start"] < stretch["end"]
    if (CORPUS / "MANIFEST.csv").exists():
        manifest = pd.read_csv(CORPUS / "MANIFEST.csv")
        assert set(files) == set(manifest["file"])
        for entry in labels:
            row = manifest[manifest["file"] == entry["file"]].iloc[0]
            quiet = row["your_observation"].startswith("NO VISIBLE PROBLEM")
            assert quiet == (entry["verdict"] == "no visible problem"), entry["file"]


def test_a_label_allows_a_signal_over_the_whole_run_or_over_stretches(tmp_path) -> None:
    """``allowed`` excuses one finding in the whole run; each ``[[run.allow]]`` one in its
    stretch (a plateau in each epoch of a multi-epoch fine-tune)."""
    history = [{"step": s, "loss": 1.0 + 0.01 * (s % 3), "epoch": s / 100}
               for s in range(1, 201)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    labels = [{"file": "trainer_state.json", "verdict": "problems", "allowed": ["overfit"],
               "allow": [{"signal": "plateau", "start": 0, "end": 100},
                         {"signal": "plateau", "start": 100, "end": 201}]}]
    [case] = corpus_cases(tmp_path, labels)
    assert case.allowed == {"overfit": [(0, FOREVER)], "plateau": [(0, 100), (100, 201)]}
    # One plateau in each epoch is excused; a second in the same epoch flaps.
    assert match([], [50, 150], case.allowed["plateau"])["fp"] == 0
    assert match([], [50, 80], case.allowed["plateau"])["fp"] == 1


def test_the_speed_figures_time_a_poll_on_top_of_a_settled_history() -> None:
    """Speed goals live here, not in timed unit tests: the figures exist and the polls
    are measured on analyzers that analysed the history before (streaming state)."""
    from benchmarks.detect import bench_speed

    result = bench_speed(points=20_000, new=100)
    for history in ("10,000", "20,000"):
        for part in ("storing", "reading from the store", "analysing"):
            assert result[f"100 new points on {history} history: {part} s"] > 0
        assert result[f"100 new points on {history} history: slowest"]
    assert result["20,000 points from scratch s"] >= result["of which reading the series s"]


NEW_SIGNALS = ["forgetting", "business_flat", "reward_hacking", "stalled", "repetition",
               "role_confusion", "over_refusal"]
NEW_NEGATIVES = ["negative/general_suite_noise", "negative/business_tracks_loss",
                 "negative/rl_healthy", "negative/eval_pauses_live", "negative/finished",
                 "negative/generations_diverse", "negative/generations_markers"]


def repeated_rate(text: str, n: int = 4) -> float:
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def by_step(data: RunData, column: str = "output", probe: bool | None = None) -> dict:
    rows = data.generations
    if probe is not None:
        rows = rows[rows["probe"] == probe]
    return {int(s): list(g[column]) for s, g in rows.groupby("step")}


def test_the_new_signals_are_deterministic_for_a_seed() -> None:
    def same(a: RunData, b: RunData) -> bool:
        return (frames_equal(a, b) and a.generations.equals(b.generations)
                and a.now == b.now)

    one = synthetic_suite(seed=5, repeats=1, signals=NEW_SIGNALS + NEW_NEGATIVES)
    two = synthetic_suite(seed=5, repeats=1, signals=NEW_SIGNALS + NEW_NEGATIVES)
    other = synthetic_suite(seed=6, repeats=1, signals=NEW_SIGNALS + NEW_NEGATIVES)
    assert [c.name for c in one] == [c.name for c in two] == [c.name for c in other]
    assert len(one) == 7 * 3 + 7
    assert all(same(a.data, b.data) and a.events == b.events
               for a, b in zip(one, two, strict=True))
    assert not any(same(a.data, b.data) for a, b in zip(one, other, strict=True))


def test_the_new_labels_are_where_the_injection_is() -> None:
    cases = synthetic_suite(seed=0, repeats=2, signals=NEW_SIGNALS)
    assert {c.name.split("/")[0] for c in cases} == set(NEW_SIGNALS)
    for case in cases:
        [event] = case.events
        data, onset, name = case.data, event.onset, case.name
        every = event.unit
        assert event.tolerance >= 0 and event.strength in ("weak", "medium", "strong")
        if event.signal == "forgetting":
            acc = data.series("eval/general/accuracy")
            before = acc[acc.index < onset]
            later = acc[acc.index >= onset + 4 * every]
            assert later.iloc[:4].median() < 0.985 * before.median(), name
            assert data.series("eval/loss").iloc[-1] < data.series("eval/loss").iloc[0]
        elif event.signal == "business_flat":
            biz = data.series("eval/business/pass_rate")
            before = biz[biz.index < onset]
            after = biz[biz.index >= onset]
            assert before.iloc[-1] > before.iloc[0], name  # it improved before the break
            assert after.max() < before.iloc[-1] * 1.05, name
            loss = data.series("train/loss")
            assert loss[loss.index >= onset].iloc[-50:].median() < \
                loss[loss.index < onset].iloc[-50:].median(), name
        elif event.signal == "reward_hacking":
            judge = data.series("eval/judge/score")
            best = judge[judge.index < onset].iloc[-3:].median()
            assert judge[judge.index >= onset + 5 * every].iloc[:3].median() < best, name
            for tag in ("reward", "kl"):
                s = data.series(tag)
                assert s[s.index >= onset].iloc[-20:].median() > \
                    s[s.index < onset].iloc[-20:].median(), (name, tag)
        elif event.signal == "stalled":
            assert int(data.metrics["step"].max()) == onset, name
            assert data.now - data.metrics["wall_time"].max() >= 1800, name
            assert data.metrics["wall_time"].notna().all()
        elif event.signal == "repetition":
            for step, outputs in by_step(data).items():
                if step < onset:
                    assert max(repeated_rate(o) for o in outputs) < 0.2, (name, step)
            assert max(repeated_rate(o) for o in by_step(data)[onset]) > 0.3, name
        elif event.signal == "role_confusion":
            marked = {s: sum("\n" in o for o in outputs)
                      for s, outputs in by_step(data).items()}
            assert all(n == 0 for s, n in marked.items() if s < onset), name
            assert sum(n for s, n in marked.items() if s >= onset) > 0, name
        elif event.signal == "over_refusal":
            rates = {s: np.mean([o[0] in "IA抱" for o in outputs])
                     for s, outputs in by_step(data, probe=True).items()}
            before = np.mean([r for s, r in rates.items() if s < onset])
            after = np.mean([r for s, r in rates.items() if s >= onset])
            assert before <= 0.1 and after >= before + 0.15, name
            assert all(o[0] in "IA抱" for o in data.generations[~data.generations["probe"]]
                       ["output"])  # red-team prompts are refused throughout


def test_the_new_signals_end_to_end() -> None:
    cases = synthetic_suite(seed=0, repeats=1, signals=NEW_SIGNALS + NEW_NEGATIVES)
    result = evaluate(cases)
    for signal in NEW_SIGNALS:
        s = result.ours[signal]
        assert s["events"] == 3, signal
        assert s["recall"] is not None and s["recall"] >= 2 / 3, signal
        assert s["false_alarms_per_10k"] == 0, signal  # the new controls stay quiet
    assert result.ours["stalled"]["recall"] == 1.0
    assert result.ours["stalled"]["median_delay_steps"] == 0
    header, rows = detection_tables(result)
    shown = {r[0] for r in rows}
    assert set(NEW_SIGNALS) <= shown
    assert not any("no synthetic cases" in r for r in rows if r[0] in NEW_SIGNALS)


def _stats(**figures: float | None) -> dict[str, float | None]:
    base: dict[str, float | None] = {
        "events": 12, "precision": 1.0, "recall": 1.0, "f1": 1.0, "median_delay_units": 1.0,
        "median_delay_share": 0.01, "false_alarms_per_10k": 0.0}
    return {**base, **figures}


def test_target_verdicts_follow_the_issue() -> None:
    assert target_misses("plateau", _stats()) == []
    assert target_misses("plateau", _stats(f1=0.89, median_delay_share=0.021)) == [
        "F1 < 0.9", "delay > 2% of the run"]
    # An eval signal's delay is judged in evaluations, not as a share of the run.
    assert target_misses("overfit", _stats(median_delay_units=3.5, median_delay_share=0.5)
                         ) == ["delay > 3 evals"]
    # checkpoint_gap's series is the saves: its delay is judged in save intervals.
    assert target_misses("checkpoint_gap", _stats(median_delay_units=2.0,
                                                  median_delay_share=0.15)) == []
    assert target_misses("checkpoint_gap", _stats(median_delay_units=3.5)) == [
        "delay > 3 saves"]
    assert target_misses("spike", _stats(recall=0.94, median_delay_units=2.0,
                                         false_alarms_per_10k=0.6, f1=0.1)) == [
        "recall < 0.95", "delay > 1 pt", "> 0.5 false alarms /10k"]
    assert target_misses("lr_schedule", _stats(recall=0.97, f1=0.98)) == ["recall < 1.0"]
    assert target_misses("memory", _stats(events=0, f1=None)) == []


def test_the_verdict_also_weighs_the_baselines_and_nan_inf() -> None:
    """F1 must be above each covering baseline's (a tie is not above); NaN/Inf recall 1.0
    at zero delay (the variant is labelled with no tolerance, so recall says both)."""
    peers = {"W&B": _stats(f1=0.5), "OLMo": _stats(f1=0.95), "none": _stats(events=0)}
    assert target_misses("plateau", _stats(f1=0.95), peers) == ["F1 not above OLMo"]
    # Both perfect: nothing scores above 1.0, so a tie there is no miss.
    assert target_misses("plateau", _stats(f1=1.0), {"ES": _stats(f1=1.0)}) == []
    assert target_misses("spike", _stats(), variants={"nan/inf": _stats(recall=0.9),
                                                      "finite": _stats()}) == [
        "NaN/Inf recall < 1.0 at 0 delay"]
    assert target_misses("spike", _stats(), variants={"nan/inf": _stats()}) == []


def test_no_detection_at_all_is_an_f1_of_zero_not_undefined() -> None:
    """A detector that never fires on 5 events has recall 0 and F1 0 (precision alone is
    undefined); without events F1 is undefined."""
    from benchmarks.detect import Score
    assert Score(events=5).f1 == 0.0
    assert Score().f1 is None
    assert Score(events=4, tp=2, fp=2).f1 == 0.5


def test_the_table_says_which_targets_are_met() -> None:
    result = evaluate(synthetic_suite(seed=0, repeats=1, signals=["spike", "memory"]))
    header, rows = detection_tables(result)
    assert header[-1] == "issue target" and all(len(r) == len(header) for r in rows)
    ours = {r[0]: r for r in rows if r[1] == "runwatch"}
    for signal in ("spike", "memory"):
        expected = target_misses(signal, result.ours[signal])
        assert ours[signal][-1] == ("missed: " + ", ".join(expected) if expected else "met")
        assert "% of the run" in ours[signal][6]
    assert all(r[-1] == "" for r in rows if r[1] != "runwatch")  # baselines: no verdict


def test_the_live_pause_control_polls_inside_an_evaluation_pause() -> None:
    """Half the live controls are polled in the middle of an evaluation pause (the silence
    a watcher must not take for a stall), the others between two ordinary steps."""
    from benchmarks.synthetic import _negative
    inside = []
    for i in range(4):
        run, _ = _negative("eval_pauses_live", np.random.default_rng(i), i)
        at = int(np.searchsorted(run.steps, run.cut))
        assert run.wall[at] < run.now
        pause = run.wall[at + 1] - run.wall[at]
        inside.append(bool(run.now < run.wall[at + 1]
                           and pause > 20 * np.median(np.diff(run.wall))))
    assert inside == [True, False, True, False]


@pytest.mark.parametrize("variant", ["doubled", "restarted", "constant"])
def test_an_injected_lr_change_moves_the_loss_from_where_it_starts(variant: str) -> None:
    """The loss follows the LR it got (the loss law's S1 and S2), not the declared one:
    unchanged before the LR leaves the schedule, different after."""
    from benchmarks.synthetic import PROFILES, _inject_lr, base_run
    rng = np.random.default_rng(3)
    run = base_run(rng, PROFILES[0], "cosine")
    before, declared = run.clean_loss().copy(), run.lr.copy()
    _inject_lr(run, variant, rng)
    after = run.clean_loss()
    first = int(np.flatnonzero(run.lr != declared)[0])
    np.testing.assert_array_equal(after[:first], before[:first])
    assert np.max(np.abs(after[first:] / before[first:] - 1)) > 0.005


def test_the_across_seeds_table_marks_each_seed_that_misses_a_target(tmp_path) -> None:
    """One row per signal, one cell per seed (F1 / median delay, ✗ on a missed target),
    and how many seeds meet every target; written beside the seed's own tables."""
    from benchmarks.detect import seed_rows
    results = {k: evaluate(synthetic_suite(seed=k, repeats=1, signals=["spike", "negative"]))
               for k in (0, 1)}
    good = results[0].ours["spike"]
    results[1].ours["spike"] = {**results[1].ours["spike"], "f1": 0.5, "recall": 0.5}
    header, rows = seed_rows(results)
    assert header == ["signal", "seed 0: F1 / delay", "seed 1: F1 / delay", "targets met"]
    [spike] = [r for r in rows if r[0] == "spike"]
    assert spike[1].startswith(f"{good['f1']:.2f} / ") and "✗" not in spike[1]
    assert spike[2].startswith("0.50 / 0.0%") and spike[2].endswith("✗")
    assert spike[3] == "1 of 2"
    text = markdown_section(results[0], None, "runwatch bench detect --seeds 2",
                            seeds=results)
    assert "Across seeds" in text and "| spike | " in text


def test_seeds_below_one_is_a_clear_error(tmp_path) -> None:
    from rich.console import Console

    from benchmarks.detect import main_detect
    console = Console(record=True, width=200)
    assert main_detect(output=str(tmp_path / "B.md"), console=console, seeds=0) == 2
    assert "--seeds must be 1 or more" in console.export_text()
    assert not (tmp_path / "B.md").exists()
