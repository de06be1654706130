"""W&B runs written offline by the real, pinned wandb, read back from their transaction logs;
the W&B API mapping through a fake API object (no network here)."""

import math
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from connectors.aliases import AliasTable
from connectors.base import SourceMissing, SourceUnavailable
from connectors.registry import open_source
from connectors.wandb import BLOCK_LEN, INSTALL_HINT, WandbFolder, WandbProject

wandb = pytest.importorskip(
    "wandb", reason=f"wandb is not installed ({INSTALL_HINT}); W&B runs cannot be written")

STEPS = 1500
BIG = "y" * 70_000  # one record over two 32 KiB blocks: FIRST, MIDDLE, LAST chunks
HF_STEP = AliasTable({"train/global_step": "step"})

WRITER = textwrap.dedent(f"""
    import wandb

    settings = wandb.Settings(x_disable_stats=True, x_disable_meta=True, disable_git=True,
                              console="off")
    run = wandb.init(project="rw", id="alpha1", name="alpha", settings=settings,
                     config={{"lr": 3e-4, "model": "tiny"}})
    for step in range({STEPS}):
        wandb.log({{"loss": 1.0 / (step + 1), "lr": 3e-4 * (1 - step / {STEPS}),
                   "grad_norm": 0.5 + step}}, step=step)
    wandb.config.update({{"batch_size": 8}})
    wandb.log({{"loss": float("nan"), "weights": wandb.Histogram([1, 2, 3]),
               "note": {BIG!r}}}, step={STEPS})
    run.finish()

    # HF Trainer's way: no step=, the training step is logged as train/global_step
    for resume, steps in ((None, range(4)), ("allow", [3, 4])):
        run = wandb.init(project="rw", id="beta2", resume=resume, settings=settings)
        for step in steps:
            wandb.log({{"train/loss": 10.0 - step, "train/global_step": 10 * step}})
        run.finish()
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A W&B folder with two offline runs, the second resumed once (two run folders)."""
    root = tmp_path_factory.mktemp("wb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_DIR": str(root), "WANDB_CONFIG_DIR": str(root / "config"),
           "WANDB_CACHE_DIR": str(root / "cache"), "WANDB_DATA_DIR": str(root / "data")}
    started = time.time()
    subprocess.run([sys.executable, "-c", WRITER], env=env, check=True, timeout=300,
                   capture_output=True)
    return root, started, time.time()


def expected_alpha():
    rows = [row for step in range(STEPS)
            for row in ((step, "train/loss", 1.0 / (step + 1)),
                        (step, "lr", 3e-4 * (1 - step / STEPS)),
                        (step, "grad_norm", 0.5 + step))]
    return rows + [(STEPS, "train/loss", math.nan)]


def points(batch):
    frame = batch.points
    return [(int(s), t, v) for s, t, v in zip(frame["step"], frame["tag"], frame["value"],
                                              strict=True)]


def same(got, want):
    """Equal, NaN included (NaN != NaN); W&B does not keep the order of keys in a row."""
    got, want = (sorted(rows, key=lambda r: r[:2]) for rows in (got, want))
    return len(got) == len(want) and all(
        g[:2] == w[:2] and (g[2] == w[2] or math.isnan(g[2]) and math.isnan(w[2]))
        for g, w in zip(got, want, strict=True))


def readers(path, **kwargs):
    return {r.run: r for r in open_source(f"wandb://{path}", **kwargs).discover()}


def alpha_log(root):
    (folder,) = (root / "wandb").glob("offline-run-*-alpha1")
    return folder / "run-alpha1.wandb"


def test_offline_run_is_read_exactly(runs):
    root, started, ended = runs
    found = readers(root)
    assert sorted(found) == ["alpha1", "beta2"]
    alpha = found["alpha1"]
    assert alpha.key == f"wandb:{root / 'wandb' / 'alpha1'}"
    batch = alpha.read()
    assert same(points(batch), expected_alpha())
    assert batch.points["wall_time"].between(started, ended).all()
    assert batch.skipped_values == 1  # the string; the histogram is media, not a value
    assert batch.malformed == []
    assert batch.meta == {"run_id": "alpha1", "project": "rw", "display_name": "alpha",
                          "config": {"lr": 3e-4, "model": "tiny", "batch_size": 8},
                          "status": "finished"}
    assert batch.cursor["offsets"] == {
        f"{alpha_log(root).parent.name}/run-alpha1.wandb": alpha_log(root).stat().st_size}


def test_the_logged_training_step_wins_and_a_resumed_run_is_one_run(runs):
    root, _, _ = runs
    beta = readers(root / "wandb", aliases=HF_STEP)["beta2"]
    batch = beta.read()
    assert points(batch) == [(0, "train/loss", 10.0), (10, "train/loss", 9.0),
                             (20, "train/loss", 8.0), (30, "train/loss", 7.0),
                             (30, "train/loss", 7.0), (40, "train/loss", 6.0)]
    assert len(batch.cursor["offsets"]) == 2
    assert beta.read(batch.cursor).points.empty
    # without the alias, W&B's own counter is the step: offline, a resume restarts it
    plain = [p for p in points(readers(root)["beta2"].read()) if p[1] == "train/loss"]
    assert plain == [(0, "train/loss", 10.0), (1, "train/loss", 9.0), (2, "train/loss", 8.0),
                     (3, "train/loss", 7.0), (0, "train/loss", 7.0), (1, "train/loss", 6.0)]


def test_a_growing_log_is_read_incrementally_without_loss_or_repeats(runs, tmp_path):
    root, _, _ = runs
    data = alpha_log(root).read_bytes()
    assert len(data) > 3 * BLOCK_LEN
    folder = tmp_path / "wandb" / "offline-run-20240101_000000-alpha1"
    folder.mkdir(parents=True)
    log = folder / "run-alpha1.wandb"
    got, cursor = [], None
    for cut in [*range(0, len(data), 7919), len(data)]:  # cuts land inside chunks and headers
        log.write_bytes(data[:cut])
        (reader,) = open_source(f"wandb://{tmp_path}").discover()
        batch = reader.read(cursor)
        assert batch.malformed == []
        got += points(batch)
        cursor = batch.cursor
    assert same(got, expected_alpha())
    assert cursor["offsets"] == {f"{folder.name}/run-alpha1.wandb": len(data)}


def copy_alpha(root, tmp_path, data):
    folder = tmp_path / "wandb" / "offline-run-20240101_000000-alpha1"
    folder.mkdir(parents=True)
    (folder / "run-alpha1.wandb").write_bytes(data)
    (reader,) = open_source(f"wandb://{tmp_path}").discover()
    return reader


def test_a_corrupt_block_is_counted_and_the_rest_is_read(runs, tmp_path):
    root, _, _ = runs
    data = bytearray(alpha_log(root).read_bytes())
    data[BLOCK_LEN + 100] ^= 0xFF
    batch = copy_alpha(root, tmp_path, bytes(data)).read()
    assert len(batch.malformed) >= 1
    assert all("run-alpha1.wandb: " in why for _, why in batch.malformed)
    assert any("skipped the rest of its 32768-byte block" in why for _, why in batch.malformed)
    got = points(batch)
    lost = sorted(set(range(STEPS + 1)) - {step for step, _, _ in got})
    # a step is one history record: only those in the damaged 32 KiB block are lost
    assert lost == list(range(lost[0], lost[-1] + 1)) and 0 < len(lost) < 150
    assert same(got, [row for row in expected_alpha() if row[0] not in lost])


def test_a_truncated_log_waits_then_a_final_read_counts_it(runs, tmp_path):
    root, _, _ = runs
    data = alpha_log(root).read_bytes()
    size = BLOCK_LEN + 5000
    reader = copy_alpha(root, tmp_path, data[:size])
    batch = reader.read()
    assert batch.malformed == [] and batch.points["step"].max() > 0
    ((name, at),) = batch.cursor["offsets"].items()
    assert name.endswith("/run-alpha1.wandb") and at < size
    final = reader.read(batch.cursor, final=True)
    assert final.points.empty
    assert final.malformed == [(at, f"{name}: truncated record at byte {at}: the last "
                                    f"{size - at} bytes are unreadable")]
    assert reader.read(final.cursor, final=True).malformed == []


def test_a_file_that_is_no_transaction_log_is_reported_once(tmp_path):
    folder = tmp_path / "wandb" / "run-20240101_000000-junk1"
    folder.mkdir(parents=True)
    (folder / "run-junk1.wandb").write_bytes(b"this is not a W&B log")
    (reader,) = open_source(f"wandb://{tmp_path}").discover()
    batch = reader.read()
    assert [why for _, why in batch.malformed] == [
        f"run-20240101_000000-junk1/run-junk1.wandb: not a W&B transaction log of the version "
        f"runwatch reads; {INSTALL_HINT} wherever runs are written, or use "
        f"wandb://ENTITY/PROJECT"]
    assert reader.read(batch.cursor).malformed == []


def test_run_folders_files_and_names(runs, tmp_path):
    root, _, _ = runs
    log = alpha_log(root)
    assert list(readers(log.parent)) == ["alpha1"]
    assert list(readers(log)) == ["alpha1"]
    assert list(readers(log.parent, run="baseline")) == ["baseline"]
    assert readers(log.parent)["alpha1"].key == readers(root)["alpha1"].key
    (tmp_path / "wandb").mkdir()
    assert readers(tmp_path) == {}
    with pytest.raises(SourceMissing, match="does not exist"):
        open_source(f"wandb://{tmp_path / 'nowhere'}").discover()


def test_engine_reads_a_wandb_folder(runs, tmp_path):
    root, _, _ = runs
    shutil.copytree(root / "wandb", tmp_path / "wandb", symlinks=True)
    settings = Settings(config=Config(sources=[SourceConfig(path=f"wandb://{tmp_path}")]),
                        secrets=Secrets(), config_path=None, db_path=str(tmp_path / "rw.db"))
    engine = Engine(settings)
    report = engine.poll()
    assert sorted(report.analysed) == ["alpha1", "beta2"]
    assert report.ingested["alpha1"].new_points == len(expected_alpha())
    assert engine.poll().analysed == []


def test_the_wandb_package_is_imported_only_for_wandb_sources():
    code = ("import sys, bot.engine, connectors.registry, connectors.wandb; "
            "print('wandb' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# the W&B API ---------------------------------------------------------------------------------
class FakeRun:
    def __init__(self, run_id, rows, name="sunny-moon-1", state="running"):
        self.id, self.name, self.state = run_id, name, state
        self.config = {"lr": 0.1, "_wandb": {"runtime": 3}}
        self.url = f"https://wandb.example/ent/proj/runs/{run_id}"
        self.rows = rows
        self.fail = None

    def scan_history(self, min_step=0, page_size=1000, use_cache=True):
        assert not use_cache  # a cached history would miss new rows of a running run
        for row in self.rows:
            if self.fail:
                raise self.fail
            if row["_step"] >= min_step:
                yield dict(row)


class FakeApi:
    def __init__(self, runs):
        self.runs_ = runs
        self.fail = None
        self.asked = []

    def runs(self, path, per_page=50):
        self.asked.append(path)
        if self.fail:
            raise self.fail
        return list(self.runs_)


def row(step, **values):
    return {"_step": step, "_timestamp": 1700000000.0 + step, "_runtime": step, **values}


def test_api_history_rows_become_points_and_reads_resume_after_the_last_step():
    run = FakeRun("r1", [row(0, loss=2.0, lr=0.1, media={"_type": "image-file"}, text="hi"),
                         row(1, loss=1.5, lr=None)])
    source = WandbProject("ent/proj", api=FakeApi([run]))
    (reader,) = source.discover()
    assert (reader.run, reader.key) == ("r1", "wandb:ent/proj/r1")
    batch = reader.read()
    assert points(batch) == [(0, "train/loss", 2.0), (0, "lr", 0.1), (1, "train/loss", 1.5)]
    assert batch.points["wall_time"].tolist() == [1700000000.0, 1700000000.0, 1700000001.0]
    assert batch.skipped_values == 1
    assert batch.cursor == {"_step": 1}
    assert batch.meta == {"config": {"lr": 0.1}, "display_name": "sunny-moon-1",
                          "status": "running", "url": "https://wandb.example/ent/proj/runs/r1"}
    run.rows.append(row(2, loss=float("nan")))
    again = reader.read(batch.cursor)
    assert points(again)[0][:2] == (2, "train/loss") and math.isnan(points(again)[0][2])
    assert again.cursor == {"_step": 2}
    assert reader.read(again.cursor).points.empty


def test_api_rows_use_the_logged_training_step():
    run = FakeRun("r1", [row(0, **{"train/loss": 2.0, "train/global_step": 500}),
                         row(1, **{"train/loss": 1.0})])
    (reader,) = WandbProject("ent/proj", HF_STEP, api=FakeApi([run])).discover()
    batch = reader.read()
    assert points(batch) == [(500, "train/loss", 2.0), (1, "train/loss", 1.0)]


def test_api_failures_are_reported_as_unavailable():
    api = FakeApi([FakeRun("r1", [row(0, loss=1.0)])])
    source = WandbProject("ent/proj", api=api)
    api.fail = wandb.errors.CommError("connection refused")
    with pytest.raises(SourceUnavailable, match=r"cannot be reached \(connection refused\)"):
        source.discover()
    api.fail = None
    (reader,) = source.discover()
    reader.api_run.fail = ConnectionResetError("reset by peer")
    with pytest.raises(SourceUnavailable, match="reading wandb:ent/proj/r1 failed"):
        reader.read()


def test_api_without_a_key_says_how_to_log_in(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with pytest.raises(SourceUnavailable, match="Set WANDB_API_KEY"):
        open_source("wandb://ent/proj").discover()


def test_targets_are_local_paths_or_entity_and_project(tmp_path):
    assert isinstance(open_source("wandb://ent/proj"), WandbProject)
    assert isinstance(open_source(f"wandb://{tmp_path}"), WandbFolder)
    assert isinstance(open_source("wandb://./wandb"), WandbFolder)
    assert isinstance(open_source("wandb://wandb"), WandbFolder)
    with pytest.raises(ValueError, match="single local run folder"):
        open_source("wandb://ent/proj", run="x")
    with pytest.raises(ValueError, match="ENTITY/PROJECT for the W&B API"):
        open_source("wandb://")
