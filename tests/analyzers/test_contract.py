"""Contract checks generated over every registered analyzer.

Each analyzer must accept empty, constant, non-finite and very long input, be
deterministic, store its parameters unchanged, reject bad configuration at construction,
and return well-formed findings. By convention every analyzer takes a ``metric`` tag and
rejects an empty one.
"""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

import analyzers
from analyzers import REGISTRY, Checkpoint, Finding, RunData
from analyzers.base import TROUBLE_KINDS
from analyzers.catalog import CATALOG

analyzers.load()
SIGNALS = sorted(REGISTRY)

# Canonical tags (DESIGN.md): every analyzer finds the metric it watches.
TAGS = ("train/loss", "eval/loss", "lr", "grad_norm", "throughput", "gpu_mem",
        "eval/general/accuracy", "eval/business/pass_rate", "reward", "kl")
SEVERITIES = {"critical", "warning", "info"}
CHECKPOINTS = [Checkpoint(step, f"ckpt/checkpoint-{step}") for step in (100, 500, 2000)]


def run_data(values: np.ndarray) -> RunData:
    return RunData.from_series("contract", {tag: values for tag in TAGS},
                               checkpoints=CHECKPOINTS)


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
        assert finding.fixes and finding.fixes == list(spec.fixes)
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


def test_constant_series_does_not_flap(signal: str) -> None:
    """Nothing happens on a constant series, so at most one episode can be reported.

    Most signals stay silent; a stuck loss *is* a plateau, which fires once and stays.
    """
    data = run_data(np.full(1000, 2.5))
    findings = REGISTRY[signal]().detect(data)
    assert len(findings) <= 1
    assert_well_formed(findings, signal, data)


def test_non_finite_values_do_not_crash(signal: str) -> None:
    data = run_data(with_events(falling_loss(3000)))
    assert_well_formed(REGISTRY[signal]().detect(data), signal, data)


def test_all_non_finite_series(signal: str) -> None:
    data = run_data(np.full(500, np.nan))
    assert_well_formed(REGISTRY[signal]().detect(data), signal, data)


def test_very_long_series(signal: str) -> None:
    data = run_data(with_events(falling_loss(200_000)))
    assert_well_formed(REGISTRY[signal]().detect(data), signal, data)


def test_detect_is_deterministic(signal: str) -> None:
    data = run_data(with_events(falling_loss(3000)))
    first = [f.to_dict() for f in REGISTRY[signal]().detect(data)]
    again = [f.to_dict() for f in REGISTRY[signal]().detect(data)]
    assert first == again


def test_parameters_are_stored_unchanged(signal: str) -> None:
    cls = REGISTRY[signal]
    defaults = {name: p.default for name, p in inspect.signature(cls).parameters.items()}
    assert cls().params() == defaults


def test_bad_configuration_raises_at_construction(signal: str) -> None:
    with pytest.raises(ValueError, match="metric"):
        REGISTRY[signal](metric="")


def test_build_names_the_bad_parameter(signal: str) -> None:
    with pytest.raises(ValueError, match="no_such_parameter"):
        analyzers.build({signal: {"no_such_parameter": 1}})
