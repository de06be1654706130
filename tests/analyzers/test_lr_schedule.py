"""The lr_schedule analyzer: the rebuilt schedule is transformers' own, faults fire at their
exact steps, correct runs (synthetic, real Hugging Face Trainer runs, real logs) stay quiet."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import TrainerCallback, get_scheduler

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.lr_schedule import LrSchedule, declared_schedule
from bot.demo.trainer import scheduled_lr
from connectors.registry import open_source
from tests.connectors.test_callbacks import train_hf
from tests.corpus import CORPUS
from tests.demo_logs import demo_logs

ROOT = Path(__file__).resolve().parents[2]
PEAK = 3e-4
STEPS = np.arange(1, 1001)
COSINE = {"learning_rate": PEAK, "lr_scheduler_type": "cosine", "warmup_steps": 100,
          "max_steps": 1000}

pytestmark = pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`")


def run(lr: np.ndarray, config: dict | None, steps: np.ndarray = STEPS,
        checkpoints: list[Checkpoint] | None = None, total: int | None = None) -> RunData:
    meta: dict = {} if config is None else {"config": config}
    if total is not None:
        meta["total_steps"] = total
    return RunData.from_series("run-1", {"lr": lr}, steps=steps, meta=meta,
                               checkpoints=checkpoints)


def transformers_lrs(name: str, warmup: int, total: int, kwargs: dict,
                     extra: int = 5) -> np.ndarray:
    """get_scheduler's LR after k scheduler steps, k = 0 … total + extra."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=warmup,
                              num_training_steps=total, scheduler_specific_kwargs=kwargs)
    lrs = []
    for _ in range(total + extra + 1):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return np.array(lrs)


def config_of(name: str, warmup: float, total: int, kwargs: dict) -> dict:
    return {"learning_rate": PEAK, "lr_scheduler_type": name, "warmup_steps": warmup,
            "max_steps": total, "lr_scheduler_kwargs": kwargs}


SCHEDULES = [
    ("constant", 10, {}),
    ("constant_with_warmup", 10, {}),
    ("linear", 10, {}),
    ("linear", 0, {}),
    ("cosine", 10, {}),
    ("cosine", 10, {"num_cycles": 1.5}),
    ("cosine_with_restarts", 10, {"num_cycles": 3}),
    ("polynomial", 10, {"power": 2.0, "lr_end": 1e-5}),
    ("inverse_sqrt", 10, {}),
    ("inverse_sqrt", 0, {"timescale": 50}),
    ("cosine_with_min_lr", 10, {"min_lr_rate": 0.1}),
    ("cosine_with_min_lr", 10, {"min_lr": 1e-5}),
    ("cosine_warmup_with_min_lr", 10, {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", 10, {"min_lr_rate": 0.1, "warmup_lr_rate": 0.2}),
    ("warmup_stable_decay", 10, {"num_decay_steps": 30}),
    ("warmup_stable_decay", 10, {"num_decay_steps": 30, "warmup_type": "cosine",
                                 "decay_type": "1-sqrt", "min_lr_ratio": 0.05}),
    ("warmup_stable_decay", 10, {"num_decay_steps": 30, "warmup_type": "1-sqrt",
                                 "decay_type": "linear"}),
]


@pytest.mark.parametrize(("name", "warmup", "kwargs"), SCHEDULES)
def test_rebuilt_schedule_is_transformers_own(name: str, warmup: int, kwargs: dict) -> None:
    schedule = declared_schedule(config_of(name, warmup, 100, kwargs), None)
    assert schedule is not None and schedule.rebuildable
    np.testing.assert_allclose(schedule.rates(np.arange(106)),
                               transformers_lrs(name, warmup, 100, kwargs),
                               rtol=1e-12, atol=1e-20)


def test_warmup_ratio_is_rounded_up_as_transformers_does() -> None:
    v5 = declared_schedule(config_of("linear", 0.03, 1218, {}), None)
    v4 = declared_schedule({**config_of("linear", 0, 1218, {}), "warmup_ratio": 0.03}, None)
    assert v5 is not None and v4 is not None and v5.warmup == v4.warmup == 37  # ceil(36.54)


@pytest.mark.parametrize(("lr", "scale", "warmup"), [(3e-3, 1.0, 20), (3e-3, 0.7, 20),
                                                     (1e-3, 1.0, 0)])
def test_demo_trainer_schedule_is_rebuilt_exactly(lr: float, scale: float, warmup: int) -> None:
    config = {"lr_schedule": {"type": "cosine_with_min_lr", "peak_lr": lr * scale,
                              "warmup_steps": warmup, "total_steps": 300, "min_lr_ratio": 0.1}}
    schedule = declared_schedule(config, 300)
    assert schedule is not None and schedule.rebuildable
    args = argparse.Namespace(lr=lr, warmup=warmup, steps=300)
    expected = [scheduled_lr(step, args) * scale for step in range(1, 301)]
    np.testing.assert_allclose(schedule.rates(np.arange(1, 301)), expected, rtol=1e-12)


@pytest.mark.parametrize(("name", "warmup", "kwargs"), [
    ("linear", 100, {}), ("cosine", 100, {}), ("constant_with_warmup", 100, {}),
    ("cosine_with_min_lr", 50, {"min_lr_rate": 0.1}), ("polynomial", 100, {"power": 2.0}),
    ("warmup_stable_decay", 100, {"num_decay_steps": 200})])
@pytest.mark.parametrize("convention", ["after_the_step", "used_by_the_step"])
@pytest.mark.parametrize("every", [1, 10])
def test_correct_runs_stay_quiet(name: str, warmup: int, kwargs: dict, convention: str,
                                 every: int) -> None:
    """Both logging conventions: transformers up to 4.4x logged the LR after the scheduler's
    step (get_scheduler's value at the step), since then the LR the step used (one before)."""
    lrs = transformers_lrs(name, warmup, 1000, kwargs)
    steps = STEPS[every - 1::every]
    logged = lrs[steps] if convention == "after_the_step" else lrs[steps - 1]
    assert LrSchedule().detect(run(logged, config_of(name, warmup, 1000, kwargs),
                                   steps=steps)) == []


def test_lr_stuck_at_peak_after_warmup_fires_once_it_is_1_percent_off() -> None:
    """003 §5.2 case 1: after warmup the LR sits at its peak while a cosine is declared."""
    good = declared_schedule(COSINE, None).rates(STEPS)
    stuck = np.where(STEPS < 100, good, PEAK)
    [finding] = LrSchedule().detect(run(stuck, COSINE))
    # The cosine is 1% below the peak (even one step earlier) from step 159 on.
    assert (finding.onset_step, finding.detected_step) == (159, 161)
    assert (finding.state, finding.resolved_step, finding.severity) == ("firing", None,
                                                                         "warning")
    assert finding.summary == ("lr left the configured cosine schedule at step 159: 0.0003 "
                               "logged vs 0.000297 expected (1.01x), more than 1% off for 3 "
                               "logged steps in a row (steps 159–161)")
    evidence = finding.evidence
    assert evidence["schedule"] == {"source": "training_arguments", "type": "cosine",
                                    "peak_lr": PEAK, "warmup_steps": 100, "total_steps": 1000}
    assert [s for s, _, _ in evidence["points"][:3]] == [159, 160, 161]
    assert all(logged == PEAK and expected < PEAK for _, logged, expected in
               evidence["points"])
    assert evidence["off_points"] == 1000 - 159 + 1
    spec = CATALOG["lr_schedule"]
    assert finding.fixes == list(spec.fixes)
    assert (finding.kind, finding.source) == ("not_learning", spec.source)
    json.dumps(finding.to_dict(), allow_nan=False)


def test_lr_doubled_from_a_step_fires_there_and_resolves() -> None:
    used = declared_schedule(COSINE, None).rates(STEPS - 1)  # transformers 5's convention
    doubled = used.copy()
    doubled[(STEPS >= 600) & (STEPS < 700)] *= 2
    checkpoints = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (500, 598, 600)]
    [finding] = LrSchedule().detect(run(doubled, COSINE, checkpoints=checkpoints))
    assert (finding.onset_step, finding.detected_step) == (600, 602)
    assert (finding.state, finding.resolved_step) == ("resolved", 702)
    assert finding.evidence["ratio_at_onset"] == pytest.approx(2.0)
    assert finding.evidence["step_offset"] == -1
    assert finding.evidence["off_points"] == 100
    assert finding.summary.endswith("(2x), more than 1% off for 3 logged steps in a row "
                                    "(steps 600–602)")
    assert finding.rollback_to is not None and finding.rollback_to.step == 598


def test_a_second_deviation_is_a_new_finding() -> None:
    lr = declared_schedule(COSINE, None).rates(STEPS)
    lr[299:305] *= 0.5
    lr[799:900] *= 3
    first, second = LrSchedule().detect(run(lr, COSINE))
    assert (first.onset_step, first.state, first.resolved_step) == (300, "resolved", 308)
    assert (second.onset_step, second.detected_step) == (800, 802)
    assert (second.state, second.resolved_step) == ("resolved", 903)


def test_a_burst_shorter_than_patience_is_not_reported() -> None:
    lr = declared_schedule(COSINE, None).rates(STEPS)
    lr[499:501] *= 50
    assert LrSchedule().detect(run(lr, COSINE)) == []
    [finding] = LrSchedule(patience=2).detect(run(lr, COSINE))
    assert (finding.onset_step, finding.detected_step, finding.resolved_step) == (500, 501, 504)


def test_a_different_warmup_is_not_judged() -> None:
    logged = declared_schedule({**COSINE, "warmup_steps": 30}, None).rates(STEPS)
    logged[STEPS > 100] = declared_schedule(COSINE, None).rates(STEPS[STEPS > 100])
    assert LrSchedule().detect(run(logged, COSINE)) == []


def test_a_schedule_built_two_steps_longer_stays_quiet_thanks_to_the_floor() -> None:
    """Seen in a real run (tinyllama_sft_lora, 2808 steps): its cosine ends 2 steps after
    max_steps, so its last hundreds of steps are more than 1% off relative to their tiny
    LRs."""
    config = {**COSINE, "max_steps": 3000}
    steps = np.arange(1, 3001)
    longer = declared_schedule({**config, "max_steps": 3002}, None).rates(steps - 1)
    assert LrSchedule().detect(run(longer, config, steps=steps)) == []
    [strict] = LrSchedule(floor=0.0).detect(run(longer, config, steps=steps))
    assert strict.onset_step > 2500


def test_non_finite_lr_is_off_schedule() -> None:
    lr = declared_schedule(COSINE, None).rates(STEPS)
    lr[400:403] = np.nan
    [finding] = LrSchedule().detect(run(lr, COSINE))
    assert (finding.onset_step, finding.resolved_step) == (401, 406)
    assert finding.evidence["ratio_at_onset"] is None
    json.dumps(finding.to_dict(), allow_nan=False)


@pytest.mark.parametrize("config", [
    None, {}, {"learning_rate": PEAK}, {**COSINE, "lr_scheduler_type": "reduce_lr_on_plateau"},
    {**COSINE, "lr_scheduler_type": "no_such_schedule"},
    {**COSINE, "deepspeed": "ds_config.json"}])
def test_nothing_declared_nothing_said(config: dict | None) -> None:
    flat = np.full(len(STEPS), PEAK)
    assert LrSchedule().detect(run(flat, config)) == []


def test_config_values_as_strings_are_read() -> None:
    """MLflow and TensorBoard hand parameters over as strings."""
    config = {"learning_rate": "0.0003", "lr_scheduler_type": "SchedulerType.COSINE",
              "warmup_steps": "100", "max_steps": "-1", "lr_scheduler_kwargs": "{}"}
    stuck = np.where(STEPS < 100, declared_schedule(COSINE, None).rates(STEPS), PEAK)
    [finding] = LrSchedule().detect(run(stuck, config, total=1000))
    assert finding.onset_step == 159


def test_runwatch_lr_schedule_block() -> None:
    block = {"lr_schedule": {"type": "cosine", "peak_lr": PEAK, "warmup_steps": 0.1,
                             "min_lr_ratio": 0.1}}
    schedule = declared_schedule(block, 1000)
    assert schedule is not None and schedule.parameters() == {
        "source": "lr_schedule", "type": "cosine_with_min_lr", "peak_lr": PEAK,
        "warmup_steps": 100, "total_steps": 1000, "min_lr_rate": 0.1}
    expected = transformers_lrs("cosine_with_min_lr", 100, 1000, {"min_lr_rate": 0.1})
    np.testing.assert_allclose(schedule.rates(STEPS), expected[STEPS], rtol=1e-12)
    doubled = expected[STEPS] * np.where(STEPS >= 400, 2.0, 1.0)
    [finding] = LrSchedule().detect(run(doubled, block, total=1000))
    assert (finding.onset_step, finding.detected_step) == (400, 402)


class TestDeclaredDecayWithoutItsLength:
    """Only the schedule's type is known: an LR exactly flat at its maximum after warmup,
    while a decay is declared, is the one thing that can be said."""

    CONFIG = {"learning_rate": PEAK, "lr_scheduler_type": "cosine", "warmup_steps": 100}

    def test_a_flat_lr_fires(self) -> None:
        flat = np.minimum(STEPS / 100, 1.0) * PEAK
        [finding] = LrSchedule().detect(run(flat, self.CONFIG))
        assert (finding.onset_step, finding.detected_step, finding.state) == (101, 150,
                                                                               "firing")
        assert finding.summary == ("lr has stayed at 0.0003 for 50 logged steps after "
                                   "warmup (steps 100–150) although the config declares a "
                                   "cosine decay")
        assert finding.evidence["flat_value"] == PEAK
        assert finding.evidence["schedule"]["total_steps"] is None

    def test_it_resolves_when_the_decay_starts(self) -> None:
        lr = np.minimum(STEPS / 100, 1.0) * PEAK
        lr[STEPS > 300] = PEAK * np.linspace(1, 0.1, int(np.sum(STEPS > 300)) + 1)[1:]
        [finding] = LrSchedule().detect(run(lr, self.CONFIG))
        assert (finding.onset_step, finding.resolved_step) == (101, 301)

    def test_a_decaying_lr_and_a_wait_at_zero_stay_quiet(self) -> None:
        decaying = declared_schedule(COSINE, None).rates(STEPS)
        assert LrSchedule().detect(run(decaying, self.CONFIG)) == []
        waiting = np.where(STEPS <= 80, 0.0, decaying)  # fp16 loss-scale search: lr 0
        config = {"lr_scheduler_type": "linear", "warmup_ratio": 0.1}
        assert LrSchedule().detect(run(waiting, config)) == []

    def test_warmup_unknown_starts_where_the_lr_stops_rising(self) -> None:
        flat = np.minimum(STEPS / 60, 1.0) * PEAK
        config = {"lr_scheduler_type": "linear", "warmup_ratio": 0.06}
        [finding] = LrSchedule().detect(run(flat, config))
        assert (finding.onset_step, finding.detected_step) == (61, 110)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"tolerance": 0}, "tolerance"),
    ({"tolerance": 1.0}, "tolerance"),
    ({"floor": -0.1}, "floor"),
    ({"patience": 0}, "patience"),
    ({"resolve_points": 0}, "resolve_points"),
    ({"step_slack": -1}, "step_slack"),
    ({"step_slack": 1.5}, "step_slack"),
    ({"flat_points": 1}, "flat_points"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        LrSchedule(**kwargs)


def test_a_million_points_are_analysed() -> None:
    steps = np.arange(1, 1_000_001)
    config = {**COSINE, "max_steps": 1_000_000}
    lr = declared_schedule(config, None).rates(steps)
    lr[500_000:] *= 1.5
    data = run(lr, config, steps=steps)
    data.series("lr")
    [finding] = LrSchedule().detect(data)
    assert finding.onset_step == 500_001


# ------------------------------------------------------------ real Hugging Face Trainer
class DoubleLrAfter(TrainerCallback):
    """A bug in a training script: the scheduler's base LR doubles after step 15."""

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        if state.global_step == 15:
            lr_scheduler.base_lrs = [2 * lr for lr in lr_scheduler.base_lrs]


def hf_run(tmp_path: Path, callbacks=(), save_steps: int = 1000, **settings) -> RunData:
    """A 30-step run of a tiny GPT-2 with runwatch's callback (a few seconds)."""
    train_hf(tmp_path, callbacks=callbacks, max_steps=30, save_steps=save_steps,
             eval_strategy="no", **settings)
    batch = open_source(str(tmp_path)).discover()[0].read(final=True)
    return RunData(run="hf", metrics=batch.points, checkpoints=batch.checkpoints,
                   meta=batch.meta)


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    {"lr_scheduler_type": "cosine", "warmup_steps": 5},
    {"lr_scheduler_type": "linear", "warmup_steps": 0.2}])
def test_real_trainer_runs_stay_quiet(tmp_path: Path, settings: dict) -> None:
    """The runwatch callback's log: TrainingArguments as config, max_steps as total. (Every
    schedule type is checked against get_scheduler above, in both logging conventions.)"""
    data = hf_run(tmp_path, **settings)
    assert data.meta["config"]["lr_scheduler_type"] == settings["lr_scheduler_type"]
    assert len(data.series("lr")) == 30
    assert LrSchedule().detect(data) == []


@pytest.mark.slow
def test_real_trainer_run_whose_lr_doubles_fires_at_the_first_doubled_step(
        tmp_path: Path) -> None:
    data = hf_run(tmp_path, callbacks=[DoubleLrAfter()], save_steps=10,
                  lr_scheduler_type="cosine", warmup_steps=5)
    [finding] = LrSchedule().detect(data)
    assert (finding.onset_step, finding.detected_step, finding.state) == (17, 19, "firing")
    assert finding.evidence["ratio_at_onset"] == pytest.approx(2.0)
    assert finding.evidence["step_offset"] == -1  # transformers logs the LR the step used
    assert finding.rollback_to is not None and finding.rollback_to.step == 10


# --------------------------------------------------------------------- demo trainer
@pytest.mark.slow
def test_demo_trainer_without_an_lr_fault_is_on_schedule() -> None:
    assert LrSchedule().detect(demo_logs()["none"]) == []
    assert LrSchedule().detect(demo_logs()["bad_batch"]) == []


@pytest.mark.slow
def test_demo_trainer_lr_burst_fires_at_step_150() -> None:
    """``--fault lr``: 50x the LR for steps 150–152. The LR is not the configured one, so
    this is right, besides the loss spike it causes."""
    [finding] = LrSchedule().detect(demo_logs()["lr"])
    assert (finding.onset_step, finding.detected_step) == (150, 152)
    assert (finding.state, finding.resolved_step) == ("resolved", 155)
    assert finding.evidence["ratio_at_onset"] == pytest.approx(50.0)
    assert finding.evidence["step_offset"] == 0
    assert finding.evidence["schedule"] == {
        "source": "lr_schedule", "type": "cosine_with_min_lr", "peak_lr": 3e-3,
        "warmup_steps": 20, "total_steps": 300, "min_lr_rate": 0.1}
    assert finding.rollback_to is not None and finding.rollback_to.step == 100


# ------------------------------------------------------------------------- real logs
REAL_RECIPES = {
    # transformers 4.x convention (the LR after the step), warmup ratio rounded up
    "hf_trainer_state/stanford_alpaca_repro.json": {
        "learning_rate": 2e-5, "lr_scheduler_type": "cosine", "warmup_steps": 0,
        "warmup_ratio": 0.03, "max_steps": -1},
    "hf_trainer_state/llama2_hrchatbot_ds3_noprogress.json": {
        "learning_rate": 2e-4, "lr_scheduler_type": "linear", "warmup_steps": 2},
    "hf_trainer_state/whisper_tiny_nbailab_100k.json": {
        "learning_rate": 3e-6, "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": 1000},
    "hf_trainer_state/glm_finetune_2000.json": {
        "learning_rate": 5e-5, "lr_scheduler_type": "linear", "warmup_steps": 0},
    # the newer convention (the LR each step used), logged every 10 / 15 steps
    "hf_console_log/qwen3_medical_qlora_training.log": {
        "learning_rate": 2e-4, "lr_scheduler_type": "cosine", "warmup_steps": 0.03},
    "hf_trainer_state/tinyllama_sft_lora.json": {
        "learning_rate": 1e-5, "lr_scheduler_type": "cosine", "warmup_ratio": 0.02},
}


def read_corpus(name: str) -> RunData:
    batch = open_source(str(CORPUS / name)).discover()[0].read(final=True)
    return RunData(run=name, metrics=batch.points, checkpoints=batch.checkpoints,
                   meta=batch.meta)


@pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")
@pytest.mark.parametrize("name", sorted(REAL_RECIPES))
def test_real_logs_follow_their_recipe(name: str) -> None:
    """Real runs' LR logs, with the recipe each was trained with declared (the files keep
    only their total steps): the rebuilt schedule matches both logging conventions."""
    data = read_corpus(name)
    data.meta = {**data.meta, "config": REAL_RECIPES[name]}
    assert LrSchedule().detect(data) == []


@pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")
def test_a_real_log_with_its_lr_raised_fires_at_that_step() -> None:
    data = read_corpus("hf_trainer_state/stanford_alpaca_repro.json")
    frame = data.metrics.copy()
    raised = (frame["tag"] == "lr") & (frame["step"] >= 500)
    frame.loc[raised, "value"] *= 1.3
    data = RunData(run="alpaca", metrics=frame,
                   meta={**data.meta, "config": REAL_RECIPES[
                       "hf_trainer_state/stanford_alpaca_repro.json"]})
    [finding] = LrSchedule().detect(data)
    assert (finding.onset_step, finding.detected_step) == (500, 502)


def corpus_files() -> list[tuple[str, str]]:
    manifest = CORPUS / "MANIFEST.csv"
    if not manifest.exists():
        return []
    import csv
    with manifest.open() as fh:
        return [(row["file"], row["your_observation"]) for row in csv.DictReader(fh)]


@pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")
@pytest.mark.parametrize(("name", "observation"), corpus_files())
def test_corpus_logs_declare_no_schedule_and_get_no_finding(name: str,
                                                            observation: str) -> None:
    """None of the corpus files carries its LR schedule, so nothing can be said; in
    particular the NO VISIBLE PROBLEM ones get no critical and at most one warning."""
    for data in (RunData(run=name, metrics=b.points, checkpoints=b.checkpoints, meta=b.meta)
                 for b in (s.read(final=True)
                           for s in open_source(str(CORPUS / name)).discover())):
        findings = LrSchedule().detect(data)
        assert findings == []
        if observation.startswith("NO VISIBLE PROBLEM"):
            assert not [f for f in findings if f.severity == "critical"]
            assert len(findings) <= 1
