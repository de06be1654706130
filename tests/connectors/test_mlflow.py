"""The MLflow source against a real ``mlflow server``, written to by the real client."""

import json
import logging
import math
import socket
import time

import pytest
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric
from mlflow.tracking import MlflowClient
from mlflow.utils import rest_utils
from mlflow.utils.search_utils import SearchUtils

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from connectors.base import SourceMissing, SourceUnavailable
from connectors.mlflow import MlflowSource, parse_target
from connectors.registry import open_source
from tests.connectors.mlflow_server import free_port, running_server

T0 = 1_700_000_000_000  # ms; explicit timestamps make the logged order exact


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


def client_for(server):
    return MlflowClient(server.url)


def new_run(client, request, name, *, params=None, tags=None):
    """A run in the test's own experiment (created on first use)."""
    found = client.get_experiment_by_name(request.node.name)
    experiment_id = found.experiment_id if found else client.create_experiment(request.node.name)
    run = client.create_run(experiment_id, run_name=name, tags=tags or {})
    for key, value in (params or {}).items():
        client.log_param(run.info.run_id, key, value)
    return run.info.run_id


def log(client, run_id, key, steps, value=lambda s: 1.0 / s, offset=0):
    client.log_batch(run_id, metrics=[Metric(key, value(s), T0 + s * 1000 + offset, s)
                                      for s in steps])


def log_dataset(client, run_id):
    dataset = Dataset(name="tokens", digest="d1g3st", source_type="local", source="{}")
    client.log_inputs(run_id, [DatasetInput(dataset, [InputTag("mlflow.data.context", "train")])])


def points(batch):
    return [tuple(row) for row in batch.points.itertuples(index=False)]


def source_for(server, request, **query):
    query = {"experiment": request.node.name, **query}
    return open_source(f"mlflow://{server.address}?"
                       + "&".join(f"{k}={v}" for k, v in query.items()))


def only(readers):
    [reader] = readers
    return reader


def count_requests(monkeypatch):
    """How many HTTP requests the MLflow client makes from now on."""
    calls = []
    real = rest_utils.http_request
    monkeypatch.setattr(rest_utils, "http_request",
                        lambda *a, **k: calls.append(k.get("endpoint")) or real(*a, **k))
    return calls


# URI ------------------------------------------------------------------------------------

def test_uri_forms():
    assert parse_target("10.0.0.5:5000?experiment=sft") == ("http://10.0.0.5:5000", "sft", None)
    assert parse_target("host:80/mlflow/?experiment=a%26b&run=r1") == (
        "http://host:80/mlflow", "a&b", "r1")
    assert parse_target("https://mlflow.example.com/p?experiment=12") == (
        "https://mlflow.example.com/p", "12", None)
    source = open_source("mlflow://127.0.0.1:9?experiment=sft", run="mine")
    assert isinstance(source, MlflowSource) and source.uri == "mlflow://127.0.0.1:9?experiment=sft"
    assert (source.run_selector, source.name) == ("mine", "mine")


@pytest.mark.parametrize(("target", "message"), [
    ("127.0.0.1:5000", "say which experiment to watch"),
    ("127.0.0.1:5000?experiment=a&exp=b", "unknown option exp"),
    ("?experiment=a", "no server host"),
])
def test_uri_mistakes_say_how_to_write_it(target, message):
    with pytest.raises(ValueError, match=message):
        open_source(f"mlflow://{target}")


# Failures that need no server --------------------------------------------------------------

def test_unreachable_server_fails_fast_then_backs_off(monkeypatch):
    now = [0.0]
    source = open_source(f"mlflow://127.0.0.1:{free_port()}?experiment=sft")
    source.clock = lambda: now[0]
    started = time.perf_counter()
    with pytest.raises(SourceUnavailable, match="is not reachable .* check that it is up"):
        source.discover()
    assert time.perf_counter() - started < 5
    calls = count_requests(monkeypatch)
    with pytest.raises(SourceUnavailable, match="is not reachable"):
        source.discover()  # inside the backoff: not even tried
    assert calls == []
    now[0] += 2.5
    with pytest.raises(SourceUnavailable):
        source.discover()
    assert len(calls) == 1


def test_a_server_that_never_answers_times_out(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as silent:  # accepts connections (backlog), never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        source = open_source(f"mlflow://127.0.0.1:{silent.getsockname()[1]}?experiment=sft")
        started = time.perf_counter()
        with pytest.raises(SourceUnavailable, match="did not answer within 1 s"):
            source.discover()
        assert time.perf_counter() - started < 4


# Reading from a real server ------------------------------------------------------------------

@pytest.mark.slow
def test_exact_points_then_only_new_ones(mlflow_server, request):
    client = client_for(mlflow_server)
    run_id = new_run(client, request, "sft", params={"max_steps": 100, "learning_rate": 3e-4},
                     tags={"mlflow.note.content": "baseline", "data_version": "v3",
                           "mlflow.user": "ana"})
    log_dataset(client, run_id)
    log(client, run_id, "loss", range(1, 4))
    log(client, run_id, "learning_rate", range(1, 4), value=lambda s: 0.1 * s, offset=1)
    log(client, run_id, "eval_loss", [3], value=lambda s: 2.5, offset=2)
    source = source_for(mlflow_server, request)
    reader = only(source.discover())
    assert (reader.run, reader.key) == ("sft", f"mlflow:{run_id}")

    batch = reader.read(None)
    assert points(batch) == [
        (1, "train/loss", 1.0, 1_700_000_001.0), (1, "lr", 0.1, 1_700_000_001.001),
        (2, "train/loss", 0.5, 1_700_000_002.0), (2, "lr", 0.2, 1_700_000_002.001),
        (3, "train/loss", 1 / 3, 1_700_000_003.0), (3, "lr", 0.1 * 3, 1_700_000_003.001),
        (3, "eval/loss", 2.5, 1_700_000_003.002)]
    assert json.loads(json.dumps(batch.cursor, allow_nan=False)) == batch.cursor
    assert batch.meta["config"] == {"max_steps": "100", "learning_rate": "0.0003"}
    assert (batch.meta["total_steps"], batch.meta["status"]) == (100, "RUNNING")
    assert (batch.meta["note"], batch.meta["data_version"]) == ("baseline", "v3")
    assert batch.meta["datasets"] == [{"name": "tokens", "digest": "d1g3st", "context": "train"}]
    assert (batch.meta["environment"], batch.meta["tags"]) == ({"user": "ana"},
                                                                {"data_version": "v3"})

    log(client, run_id, "loss", [4, 5])
    reader = only(source.discover())
    second = reader.read(batch.cursor)
    assert points(second) == [(4, "train/loss", 0.25, 1_700_000_004.0),
                              (5, "train/loss", 0.2, 1_700_000_005.0)]
    assert only(source.discover()).read(second.cursor).points.empty


@pytest.mark.slow
def test_a_quiet_run_costs_one_request_and_a_finished_one_none(mlflow_server, request,
                                                                 monkeypatch):
    client = client_for(mlflow_server)
    run_id = new_run(client, request, "quiet")
    log(client, run_id, "loss", range(1, 50))
    log(client, run_id, "grad_norm", range(1, 50), offset=1)
    source = source_for(mlflow_server, request)
    cursor = only(source.discover()).read(None).cursor
    reader = only(source.discover())
    calls = count_requests(monkeypatch)
    assert reader.read(cursor).points.empty
    assert len(calls) == 1  # one key looked at, for a resumed run logging lower steps again
    client.set_terminated(run_id)
    cursor = only(source.discover()).read(cursor).cursor  # the status changed: every key
    reader = only(source.discover())
    calls.clear()
    batch = reader.read(cursor)
    assert (calls, batch.meta["status"], batch.points.empty) == ([], "FINISHED", True)


@pytest.mark.slow
def test_new_runs_are_discovered_and_same_names_told_apart(mlflow_server, request):
    client = client_for(mlflow_server)
    source = source_for(mlflow_server, request)
    with pytest.raises(SourceMissing, match="no experiment"):
        source.discover()
    first = new_run(client, request, "a")
    assert [r.run for r in source.discover()] == ["a"]
    second = new_run(client, request, "a")
    new_run(client, request, "b")
    names = {r.info.run_id: r.run for r in source.discover()}
    assert names[first] == "a" and names[second] == f"a-{second[:8]}"
    assert sorted(names.values()) == sorted(["a", f"a-{second[:8]}", "b"])

    assert [r.run for r in source_for(mlflow_server, request, run="b").discover()] == ["b"]
    picked = open_source(f"mlflow://{mlflow_server.address}?experiment={request.node.name}"
                         f"&run={second}", run="a-retry")
    assert [r.run for r in picked.discover()] == ["a-retry"]
    with pytest.raises(SourceMissing, match="no run named 'c'"):
        source_for(mlflow_server, request, run="c").discover()


@pytest.mark.slow
def test_non_finite_values_and_a_step_logged_twice(mlflow_server, request):
    client = client_for(mlflow_server)
    run_id = new_run(client, request, "nan")
    values = {1: 2.0, 2: float("nan"), 3: float("inf"), 4: float("-inf")}
    log(client, run_id, "loss", values, value=values.get)
    log(client, run_id, "loss", [4], value=lambda s: 1.5, offset=500)  # step 4 again: kept last
    log(client, run_id, "global_step", [4], value=float)  # the x axis, not a metric
    batch = only(source_for(mlflow_server, request).discover()).read(None)
    got = {step: value for step, _, value, _ in points(batch)}
    assert list(batch.points["tag"].unique()) == ["train/loss"] and len(batch.points) == 4
    assert got[1] == 2.0 and math.isnan(got[2]) and got[3] == math.inf and got[4] == 1.5


@pytest.mark.slow
def test_a_resumed_run_logging_lower_steps_is_read(mlflow_server, request):
    client = client_for(mlflow_server)
    run_id = new_run(client, request, "resumed")
    log(client, run_id, "loss", range(1, 11))
    source = source_for(mlflow_server, request)
    cursor = only(source.discover()).read(None).cursor
    log(client, run_id, "loss", [6, 7], value=lambda s: 9.0, offset=100_000)  # from checkpoint 5
    batch = only(source.discover()).read(cursor)
    assert [(s, v) for s, _, v, _ in points(batch)] == [(6, 9.0), (7, 9.0)]


@pytest.mark.slow
def test_a_point_logged_with_an_old_timestamp_is_counted_not_repeated(mlflow_server, request):
    client = client_for(mlflow_server)
    run_id = new_run(client, request, "skew")
    log(client, run_id, "loss", range(1, 6))
    source = source_for(mlflow_server, request)
    cursor = only(source.discover()).read(None).cursor
    log(client, run_id, "loss", [3], value=lambda s: 7.0, offset=-10_000)  # another clock
    log(client, run_id, "loss", [6])
    batch = only(source.discover()).read(cursor)
    assert [s for s, _, _, _ in points(batch)] == [6]
    assert batch.notices and "1 point(s) of 'loss' arrived with timestamps before" in \
        batch.notices[0]
    assert only(source.discover()).read(batch.cursor).points.empty


@pytest.mark.slow
def test_a_server_refusing_offset_pages_is_read_in_full(mlflow_server, request, monkeypatch):
    client = client_for(mlflow_server)
    run_id = new_run(client, request, "tokens")
    log(client, run_id, "loss", range(1, 6))
    source = source_for(mlflow_server, request)
    cursor = only(source.discover()).read(None).cursor
    log(client, run_id, "loss", [6, 7])
    monkeypatch.setattr(SearchUtils, "create_page_token", classmethod(lambda cls, n: b"?"))
    batch = only(source.discover()).read(cursor)
    assert [s for s, _, _, _ in points(batch)] == [6, 7] and batch.notices == []


@pytest.mark.slow
def test_checkpoint_artifacts_on_local_disk(mlflow_server, request, tmp_path):
    client = client_for(mlflow_server)
    run_id = new_run(client, request, "ckpt")
    log(client, run_id, "loss", range(1, 21))
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    client.log_artifacts(run_id, str(tmp_path), artifact_path="checkpoint-20")
    batch = only(source_for(mlflow_server, request).discover()).read(None)
    [checkpoint] = batch.checkpoints
    assert checkpoint.step == 20 and checkpoint.path.endswith(f"{run_id}/artifacts/checkpoint-20")


# Outage, end to end through the engine --------------------------------------------------------

@pytest.mark.slow
def test_engine_rides_out_an_outage_losing_nothing(tmp_path, caplog):
    with running_server(tmp_path, prefix="/mlflow") as server:  # as behind a reverse proxy
        client = client_for(server)
        run_id = client.create_run(client.create_experiment("sft"), run_name="r").info.run_id
        log(client, run_id, "loss", range(1, 31), value=lambda s: 2.0 + 1.0 / s)
        uri = f"mlflow://{server.address}?experiment=sft"
        engine = Engine(Settings(config=Config(sources=[SourceConfig(path=uri)]),
                                 secrets=Secrets(), config_path=None,
                                 db_path=str(tmp_path / "rw.db")))
        assert engine.poll().analysed == ["r"]
        log(client, run_id, "loss", range(31, 36), value=lambda s: 2.0 + 1.0 / s)
        server.stop()
        with caplog.at_level(logging.WARNING, logger="runwatch.engine"):
            started = time.perf_counter()
            for _ in range(3):
                assert engine.poll().analysed == []
            assert time.perf_counter() - started < 5
        warned = [r.message for r in caplog.records if "will look again" in r.message]
        assert len(warned) == 1 and "is not reachable" in warned[0]
        server.start()
        log(client, run_id, "loss", range(36, 41), value=lambda s: 2.0 + 1.0 / s)
        deadline = time.monotonic() + 90  # the source waits out its backoff first
        while not engine.poll().analysed and time.monotonic() < deadline:
            time.sleep(0.5)
        series = engine.store.run_data("r").series("train/loss")
        assert list(series.index) == list(range(1, 41))
        assert engine.store.run("r")["attempt"] == 1
