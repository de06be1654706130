"""Contract checks generated over every registered analyzer.

Each analyzer must accept empty, constant, non-finite and very long input, be
deterministic, store its parameters unchanged, reject bad configuration at construction,
and return well-formed findings. By convention every analyzer takes a ``metric`` tag and
rejects an empty one. The run data also carries wall times, a ``now`` long after the last
point, and sample generations with the text that breaks naive code, so the time-based and
text signals are held to the same contract.
"""

from __future__ import annotations

import inspect
import json
import re
import warnings

import numpy as np
import pandas as pd
import pytest

import analyzers
from analyzers import REGISTRY, Checkpoint, Finding, RunData
from analyzers.catalog import CATALOG
from analyzers.finding import TROUBLE_KINDS

analyzers.load()
SIGNALS = sorted(REGISTRY)

# Canonical tags (DESIGN.md): every analyzer finds the metric it watches.
TAGS = ("train/loss", "eval/loss", "lr", "grad_norm", "throughput", "gpu_mem",
        "eval/general/accuracy", "eval/business/pass_rate", "eval/judge/score", "reward", "kl")
SEVERITIES = {"critical", "warning", "info"}
CHECKPOINTS = [Checkpoint(step, f"ckpt/checkpoint-{step}") for step in (100, 500, 2000)]
START = 1_700_000_000.0  # wall time of step 0; a step takes 10 s
# Outputs that break naive text code: empty, blank, CJK, emoji, a loop, role markers,
# refusals, one token, a very long one.
OUTPUTS = ("", "   ", "I can't help with that.", "抱歉，我无法回答。", "好的" * 40,
           "User: and then I asked", "<|im_start|>user\nhi", "word " * 5000,
           "A normal answer with several different words in it.", "🙂" * 50, "x")


def generations(evaluations: int = 12) -> list[dict[str, object]]:
    """The same outputs at every evaluation (the text analogue of a constant series), the
    evaluations out of order and one of them logged twice; every other row a probe."""
    steps = [100 * (evaluations - e) for e in range(evaluations)] + [100]
    return [{"step": step, "prompt": f"prompt {i}", "output": output, "probe": i % 2 == 0}
            for step in steps for i, output in enumerate(OUTPUTS)]


def run_data(values: np.ndarray, *, texts: list[dict[str, object]] | None = None) -> RunData:
    data = RunData.from_series("contract", {tag: values for tag in TAGS},
                               checkpoints=CHECKPOINTS,
                               generations=generations() if texts is None else texts,
                               now=START + 10.0 * len(values) + 100_000)
    data.metrics["wall_time"] = START + 10.0 * data.metrics["step"]
    return data


def falling_loss(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 2.0 + 3.0 * np.exp(-np.arange(n) / 300) + 0.05 * rng.standard_normal(n)


def with_events(values: np.ndarray) -> np.ndarray:
    """A copy with a jump, a NaN, +Inf and -Inf in it."""
    values = values.copy()
    n = len(values)
    values[n // 5] = values[n // 5] * 6
    values[n // 3] = np.nan
    values[n // 2] = np.inf
    values[2 * n // 3] = -np.inf
    return values


def assert_well_formed(findings: list[Finding], signal: str, data: RunData) -> None:
    spec = CATALOG[signal]
    onsets = [f.onset_step for f in findings]
    assert onsets == sorted(onsets), "findings must come oldest first"
    for finding in findings:
        assert isinstance(finding, Finding)
        assert (finding.run, finding.attempt) == (data.run, data.attempt)
        assert finding.signal == signal
        assert finding.severity in SEVERITIES
        assert finding.onset_step <= finding.detected_step
        if finding.state == "resolved":
            assert finding.resolved_step is not None
            assert finding.resolved_step >= finding.detected_step
        else:
            assert finding.state == "firing"
            assert finding.resolved_step is None
        assert finding.fixes and finding.fixes in (list(spec.fixes), list(spec.eval_fixes))
        assert finding.kind in TROUBLE_KINDS and finding.kind == spec.kind
        assert finding.source == spec.source
        if finding.rollback_to is not None:
            assert finding.rollback_to.step < finding.onset_step
        assert any(ch.isdigit() for ch in finding.summary), finding.summary
        as_dict = finding.to_dict()
        json.dumps(as_dict, allow_nan=False)
        assert Finding.from_dict(as_dict).fingerprint == finding.fingerprint


@pytest.fixture(params=SIGNALS)
def signal(request: pytest.FixtureRequest) -> str:
    return request.param


def test_the_built_ins_are_registered() -> None:
    assert {"spike", "plateau"} <= set(SIGNALS)


def test_empty_run_gives_no_findings(signal: str) -> None:
    assert REGISTRY[signal]().detect(RunData(run="empty")) == []


@pytest.mark.parametrize("level", [2.5, 0.0, -1.0, 1e-12])
def test_constant_series_does_not_flap(signal: str, level: float) -> None:
    """Nothing happens on a constant series, so at most one episode can be reported.

    Most signals stay silent; a stuck loss *is* a plateau, which fires once and stays.
    Zero, negative and tiny constants catch relative margins that vanish (a tie with a
    best of 0 is not "0.5% above" it) and logarithms of values at or below zero.
    """
    data = run_data(np.full(1000, level))
    findings = REGISTRY[signal]().detect(data)
    assert len(findings) <= 1
    assert_well_formed(findings, signal, data)
    assert [f for f in findings if f.severity == "critical"] == []


def test_non_finite_values_do_not_crash(signal: str) -> None:
    data = run_data(with_events(falling_loss(3000)))
    assert_well_formed(REGISTRY[signal]().detect(data), signal, data)


def test_all_non_finite_series(signal: str) -> None:
    """An all-NaN run: the one critical is spike's NaN alarm, which is true."""
    data = run_data(np.full(500, np.nan))
    findings = REGISTRY[signal]().detect(data)
    assert_well_formed(findings, signal, data)
    assert all(f.signal == "spike" and "NaN" in f.summary
               for f in findings if f.severity == "critical")


def test_very_long_series(signal: str) -> None:
    data = run_data(with_events(falling_loss(200_000)))
    assert_well_formed(REGISTRY[signal]().detect(data), signal, data)


def test_a_single_point_series(signal: str) -> None:
    """One logged point (a run that has just started): nothing to judge, nothing raised,
    no critical."""
    data = run_data(np.array([2.0]))
    findings = REGISTRY[signal]().detect(data)
    assert_well_formed(findings, signal, data)
    assert [f for f in findings if f.severity == "critical"] == []


def logged_out_of_order(data: RunData, seed: int = 0) -> RunData:
    """The same run as a log that holds its lines out of order, with every tenth step
    logged twice: first a wild value (1e6), then the line that replaces it (a repeated
    step keeps its last value)."""
    rows = data.metrics
    stale = rows.iloc[::10].assign(value=1e6)
    frame = pd.concat([stale, rows.sample(frac=1.0, random_state=seed)], ignore_index=True)
    return RunData(run=data.run, metrics=frame, checkpoints=data.checkpoints,
                   generations=data.generations, now=data.now)


def test_unsorted_and_repeated_steps_are_read_as_the_run_logged_them(signal: str) -> None:
    clean = run_data(eventful(3000))
    messy = logged_out_of_order(clean)
    findings = REGISTRY[signal]().detect(messy)
    assert [f.to_dict() for f in findings] == [
        f.to_dict() for f in REGISTRY[signal]().detect(clean)]
    assert_well_formed(findings, signal, messy)


@pytest.mark.parametrize("scale", [1e300, 1e-300])
def test_huge_and_tiny_values_are_judged_as_at_any_scale(signal: str, scale: float) -> None:
    """The same eventful run in units of 1e300 (or 1e-300): the same findings at the same
    steps as at scale 1, no floating-point warning (a square of 1e300 overflows), and
    summaries that stay one short line (``1.41e+300``, not three hundred digits)."""
    expected = [(f.onset_step, f.detected_step, f.severity)
                for f in REGISTRY[signal]().detect(run_data(eventful(3000)))]
    data = run_data(eventful(3000) * scale)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        findings = REGISTRY[signal]().detect(data)
    assert [(f.onset_step, f.detected_step, f.severity) for f in findings] == expected
    assert_well_formed(findings, signal, data)
    for finding in findings:
        assert not re.search(r"\d{10,}", finding.summary), finding.summary


def test_detect_is_deterministic(signal: str) -> None:
    data = run_data(with_events(falling_loss(3000)))
    first = [f.to_dict() for f in REGISTRY[signal]().detect(data)]
    again = [f.to_dict() for f in REGISTRY[signal]().detect(data)]
    assert first == again


def eventful(n: int) -> np.ndarray:
    """A falling loss with spikes of several sizes, NaN, ±Inf and a climb at the end."""
    values = with_events(falling_loss(n))
    rng = np.random.default_rng(7)
    for at in rng.integers(50, n - 50, 12):
        values[at:at + int(rng.integers(1, 6))] *= float(rng.choice([1.6, 3.0, 8.0]))
    values[-n // 10:] *= np.linspace(1.0, 4.0, n // 10)
    return values


def test_polling_a_growing_run_matches_analysing_it_at_once(signal: str) -> None:
    """Streaming state only saves work: an analyzer polled as a run grows reports what a
    fresh one reports on the whole history, at every poll."""
    values = eventful(4000)
    polled = REGISTRY[signal]()
    for n in (300, 301, 302, 900, 1500, 1510, 2600, 4000):
        data = run_data(values[:n])
        streamed = [f.to_dict() for f in polled.detect(data)]
        assert streamed == [f.to_dict() for f in REGISTRY[signal]().detect(data)], n


def test_a_rewritten_history_is_analysed_again(signal: str) -> None:
    values = eventful(3000)
    polled = REGISTRY[signal]()
    polled.detect(run_data(values[:2000]))
    rewritten = values.copy()
    rewritten[1000:1010] = 50.0
    data = run_data(rewritten)
    assert ([f.to_dict() for f in polled.detect(data)]
            == [f.to_dict() for f in REGISTRY[signal]().detect(data)])


def test_parameters_are_stored_unchanged(signal: str) -> None:
    cls = REGISTRY[signal]
    defaults = {name: p.default for name, p in inspect.signature(cls).parameters.items()}
    assert cls().params() == defaults


def test_bad_configuration_raises_at_construction(signal: str) -> None:
    with pytest.raises(ValueError, match="metric"):
        REGISTRY[signal](metric="")


@pytest.mark.parametrize("texts", [
    [],
    [{"step": 5, "prompt": "p", "output": "one evaluation only"}] * 20,
    [{"step": s, "prompt": "", "output": ""} for s in range(1, 40)],
    [{"step": s % 7, "prompt": "p", "output": "好的" * 20_000, "probe": "yes"}
     for s in range(60)],
    [{"step": s // 50, "prompt": "p", "output": f"answer {s} " + "la " * (s % 13)}
     for s in range(20_000)],
], ids=["none", "one-evaluation", "all-empty", "huge-cjk", "many"])
def test_generations_bad_input(signal: str, texts: list[dict[str, object]]) -> None:
    data = run_data(falling_loss(500), texts=texts)
    assert_well_formed(REGISTRY[signal]().detect(data), signal, data)


def test_build_names_the_bad_parameter(signal: str) -> None:
    with pytest.raises(ValueError, match="no_such_parameter"):
        analyzers.build({signal: {"no_such_parameter": 1}})
