"""Eval suites by name (issue 26 part 4): forgetting and business_flat judge only the named
suites' metrics, and never compare values across a suite's versions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzers import RunData
from analyzers.business_flat import BusinessFlat
from analyzers.forgetting import Forgetting
from analyzers.suites import VERSIONS_KEY

EVALS = np.arange(0, 6001, 250)  # 25 evaluations
NOISE = 0.003 * np.random.default_rng(1).standard_normal(len(EVALS))


def harder_suite_from(step: int) -> pd.Series:
    """A general accuracy that holds at 0.62, then reads 0.55 once a harder version of the
    suite is used from ``step``: the model did not forget anything."""
    return pd.Series(np.where(EVALS < step, 0.62, 0.55) + NOISE, index=EVALS)


def falling_domain() -> pd.Series:
    return pd.Series(1.2 + np.exp(-EVALS / 1500), index=EVALS)


def data(series: dict[str, pd.Series], marks: dict | None = None) -> RunData:
    meta = {VERSIONS_KEY: marks} if marks else {}
    return RunData.from_series("exp", series, meta=meta)


def test_forgetting_judges_only_the_named_suites() -> None:
    dropping = harder_suite_from(3000)
    run = data({"eval/mmlu/accuracy": dropping, "eval/general/accuracy": dropping,
                "eval/loss": falling_domain()})
    findings = Forgetting(suites={"mmlu": "eval/mmlu/"}).detect(run)
    assert [f.metric for f in findings] == ["eval/mmlu/accuracy"]
    assert findings[0].evidence["suite"] == "mmlu"
    # a suite named alone has its metrics under eval/<name>/
    assert [f.metric for f in Forgetting(suites=["mmlu"]).detect(run)] == ["eval/mmlu/accuracy"]
    assert Forgetting(suites=["hellaswag"]).detect(run) == []


def test_forgetting_does_not_compare_across_a_suite_version_change() -> None:
    series = {"eval/mmlu/accuracy": harder_suite_from(3000), "eval/loss": falling_domain()}
    unversioned = Forgetting(suites=["mmlu"]).detect(data(series))
    assert unversioned and unversioned[0].onset_step == 3000  # what a version-blind rule says
    marks = {"mmlu": [[None, "a1b2"], [3000, "c3d4"]]}
    assert Forgetting(suites=["mmlu"]).detect(data(series, marks)) == []


def test_forgetting_restarts_its_baseline_at_the_version_change() -> None:
    """After the change, the new version's own first evaluations are the baseline: a real
    fall within the new version is found, against 0.55, not against the old 0.62."""
    values = harder_suite_from(3000).copy()
    values[values.index >= 4500] -= 0.00004 * (values.index[values.index >= 4500] - 4250)
    series = {"eval/mmlu/accuracy": values, "eval/loss": falling_domain()}
    [finding] = Forgetting(suites=["mmlu"]).detect(
        data(series, {"mmlu": [[None, "a1b2"], [3000, "c3d4"]]}))
    assert finding.onset_step >= 4500
    assert finding.evidence["suite_version"] == "c3d4"
    assert finding.evidence["baseline"] == pytest.approx(0.55, abs=0.005)
    assert finding.evidence["baseline_step"] == 3000


def business_run(marks: dict | None) -> RunData:
    """A pass rate rising steadily on version a1b2 until step 3000, then read on a new,
    harder version c3d4 where it starts lower and keeps rising; the loss falls throughout."""
    steps = np.arange(1, 6001)
    loss = pd.Series(0.8 + 1.5 * np.exp(-steps / 2500), index=steps)
    rate = np.where(EVALS < 3000, 0.30 + 0.04 * EVALS / 1000, 0.20 + 0.04 * (EVALS - 3000) / 1000)
    return data({"train/loss": loss,
                 "eval/biz/pass_rate": pd.Series(rate + NOISE / 3, index=EVALS)}, marks)


def test_business_flat_judges_each_version_on_its_own() -> None:
    # version-blind, the fall to the harder suite's level reads as the business metric flat
    blind = BusinessFlat(suites={"biz": "eval/biz/"}).detect(business_run(None))
    assert blind and blind[0].metric == "eval/biz/pass_rate"
    marks = {"biz": [[None, "a1b2"], [3000, "c3d4"]]}
    assert BusinessFlat(suites={"biz": "eval/biz/"}).detect(business_run(marks)) == []
    # the suite's metrics only: the same series under another prefix is not judged
    assert BusinessFlat(suites=["other"]).detect(business_run(None)) == []


@pytest.mark.parametrize("cls", [Forgetting, BusinessFlat])
@pytest.mark.parametrize("suites, message", [
    ([], "suites is empty"),
    ("mmlu", "list of eval suite names"),
    ({"mmlu": ""}, "not an eval suite name"),
])
def test_bad_suites_raise_at_construction(cls, suites, message) -> None:
    with pytest.raises(ValueError, match=message):
        cls(suites=suites)
