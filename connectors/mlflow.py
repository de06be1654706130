"""Runs of an MLflow experiment, read live from a tracking server through the MLflow client.

URI (``target`` is what follows ``mlflow://``)::

    mlflow://HOST:PORT?experiment=NAME                     plain HTTP
    mlflow://HOST:PORT/PREFIX?experiment=NAME              a server behind a path prefix
    mlflow://https://HOST[:PORT][/PREFIX]?experiment=NAME  any tracking URI, HTTPS included
    …&run=NAME                                             only that run (name or run id)

``experiment`` is a name, or an id when no experiment has that name. The client's own
environment applies: ``MLFLOW_TRACKING_TOKEN`` or ``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``,
``MLFLOW_TRACKING_INSECURE_TLS``, ``MLFLOW_TRACKING_SERVER_CERT_PATH``.

Each ``discover()`` lists the experiment's runs (one paged ``search_runs``), so new runs are
watched without a restart. A run is named after its MLflow run name; a later run with the
same name gets ``-`` and the first 8 characters of its run id.

Reading is incremental. The server keeps a metric's history in (timestamp, step, value)
order and pages it by offset, so the cursor keeps, per metric key, how many points were read
and the last one; the next read asks for the history from that point on and checks that it
is still the same point before taking what follows. The run's latest values, which come with
the run listing, say which keys moved: a key that did not move costs no request, and a run
that is not RUNNING and did not change costs none at all. Resumed runs that log lower steps
again do not move the latest values, so one key of each running run is always looked at.

A server that cannot be reached raises :class:`~connectors.base.SourceUnavailable` within
seconds: unless already set, ``MLFLOW_HTTP_REQUEST_TIMEOUT`` is 5 s and
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` 0 (the client's defaults retry for minutes), and after a
failure the source waits 2 s, doubling up to 60 s, before it calls the server again. Cursors
only move with what was read, so nothing is lost or read twice across an outage.
"""

from __future__ import annotations

import bisect
import importlib.util
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit
from urllib.request import url2pathname

import pandas as pd

from analyzers.base import METRIC_COLUMNS, Checkpoint
from connectors.aliases import STEP, TIME, AliasTable
from connectors.base import Batch, RunReader, SourceMissing, SourceUnavailable, empty_points
from connectors.files import iter_checkpoint_dirs

if TYPE_CHECKING:
    from mlflow.entities import Metric, Run
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

QUERY_KEYS = ("experiment", "run")
# The client's defaults (120 s timeout, 7 retries with exponential backoff) would hold a poll
# for minutes while a server is down; the engine retries every poll instead.
CLIENT_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "5", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
BACKOFF_FIRST_S = 2.0
BACKOFF_MAX_S = 60.0
HISTORY_PAGE = 25_000  # the client's own page size for get_metric_history
SEARCH_PAGE = 1_000
TOTAL_STEP_PARAMS = ("total_steps", "max_steps", "num_training_steps", "num_train_steps",
                     "train_iters", "max_iters")
DATA_VERSION_KEYS = ("data_version", "dataset_version", "data.version")
ENVIRONMENT_TAGS = {"mlflow.source.git.commit": "git_commit", "mlflow.source.name": "source",
                    "mlflow.user": "user"}
# SQL backends cannot hold infinities and store ±float max instead; infinity is the signal.
FLOAT_MAX = 1.7976931348623157e308


def parse_target(target: str) -> tuple[str, str, str | None]:
    """``(tracking_uri, experiment, run)`` from what follows ``mlflow://``.

    >>> parse_target("127.0.0.1:5000/mlflow?experiment=llm%20sft&run=a")
    ('http://127.0.0.1:5000/mlflow', 'llm sft', 'a')
    >>> parse_target("https://mlflow.example.com?experiment=7")
    ('https://mlflow.example.com', '7', None)
    """
    example = "mlflow://HOST:PORT?experiment=NAME"
    url = target if target.lower().startswith(("http://", "https://")) else f"http://{target}"
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"mlflow://{target}: no server host; write it as {example}")
    query = parse_qs(parts.query)
    unknown = sorted(set(query) - set(QUERY_KEYS))
    if unknown:
        raise ValueError(f"mlflow://{target}: unknown option {', '.join(unknown)}; "
                         f"known: {', '.join(QUERY_KEYS)}")
    if not query.get("experiment"):
        raise ValueError(f"mlflow://{target}: say which experiment to watch, as in {example} "
                         f"(a name, or an experiment id)")
    tracking_uri = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
    run = query["run"][-1] if query.get("run") else None
    return tracking_uri, query["experiment"][-1], run


class MlflowSource:
    """The runs of one experiment on one tracking server.

    ``clock`` (monotonic seconds) paces the retries after a failed call.
    """

    def __init__(self, tracking_uri: str, experiment: str, *, run: str | None = None,
                 name: str | None = None, aliases: AliasTable | None = None,
                 uri: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_selector = run
        self.name = name
        self.aliases = aliases or AliasTable()
        self._uri = uri or f"mlflow://{tracking_uri}?experiment={experiment}"
        self.clock = clock
        self._mlflow: MlflowClient | None = None
        self._experiment_id: str | None = None
        self._outage: str | None = None
        self._retry_at = 0.0
        self._delay = 0.0

    @property
    def uri(self) -> str:
        return self._uri

    def __repr__(self) -> str:
        return f"MlflowSource({self._uri!r})"

    def discover(self) -> list[RunReader]:
        """The experiment's runs now; a selected run that does not exist yet is missing."""
        with self.talking() as client:
            experiment_id = self._resolve_experiment(client)
            runs = self._search(client, experiment_id)
        names = run_names(runs)
        live = [r for r in runs if r.info.lifecycle_stage != "deleted"]
        if self.run_selector is None:
            return [MlflowRun(self, r, names[r.info.run_id]) for r in live]
        chosen = [r for r in live if self.run_selector in
                  (r.info.run_id, r.info.run_name, names[r.info.run_id])]
        if not chosen:
            raise SourceMissing(f"{self._uri}: no run named {self.run_selector!r} in experiment "
                                f"{self.experiment!r} (yet)")
        if self.name:
            names = run_names(chosen, rename=self.name)
        return [MlflowRun(self, r, names[r.info.run_id]) for r in chosen]

    @contextmanager
    def talking(self) -> Iterator[MlflowClient]:
        """The client, for calls whose failures become SourceMissing or SourceUnavailable.

        After a failure to reach the server, calls are refused without a request until the
        backoff delay has passed, so an unreachable host does not cost a timeout every poll.
        """
        if self._outage is not None and self.clock() < self._retry_at:
            raise SourceUnavailable(self._outage)
        from mlflow.exceptions import MlflowException

        outage: SourceUnavailable | None = None
        try:
            yield self._client()
        except MlflowException as exc:
            error = self._translate(exc)
            if isinstance(error, SourceUnavailable):
                outage = error
            raise error from exc
        finally:
            if outage is None:
                self._outage, self._delay = None, 0.0
            else:
                self._outage = str(outage)
                self._delay = min(BACKOFF_MAX_S, self._delay * 2 or BACKOFF_FIRST_S)
                self._retry_at = self.clock() + self._delay

    def _client(self) -> MlflowClient:
        if self._mlflow is None:
            for name, value in CLIENT_ENV_DEFAULTS.items():
                os.environ.setdefault(name, value)
            from mlflow.tracking import MlflowClient

            self._mlflow = MlflowClient(tracking_uri=self.tracking_uri)
        return self._mlflow

    def _translate(self, exc: MlflowException) -> SourceMissing | SourceUnavailable:
        """One line that says what went wrong and what to check."""
        import requests
        import urllib3

        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, requests.RequestException):
            cause = cause.__cause__ or cause.__context__
        # Without retries, requests reports a timeout as a ConnectionError around urllib3's
        # error, whose refused connection is a kind of timeout for backward compatibility.
        reason = getattr(cause.args[0], "reason", None) if cause and cause.args else None
        timed_out = isinstance(reason, urllib3.exceptions.TimeoutError) and not isinstance(
            reason, urllib3.exceptions.NewConnectionError)
        if isinstance(cause, requests.Timeout) or timed_out:
            return SourceUnavailable(
                f"MLflow server {self.tracking_uri} did not answer within "
                f"{os.environ['MLFLOW_HTTP_REQUEST_TIMEOUT']} s; check that it is up "
                f"(MLFLOW_HTTP_REQUEST_TIMEOUT sets the wait)")
        if cause is not None:
            detail = str(reason or cause).rsplit(": ", 1)[-1]
            return SourceUnavailable(
                f"MLflow server {self.tracking_uri} is not reachable ({detail}); check that it "
                f"is up and that the host and port in {self._uri} are right")
        status = exc.get_http_status_code()
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return SourceMissing(f"{self._uri}: {exc.message}")
        if exc.error_code == "ENDPOINT_NOT_FOUND" or status == 404:
            return SourceUnavailable(
                f"{self.tracking_uri} does not answer MLflow API calls (HTTP 404); check the "
                f"path after the port in {self._uri}")
        if status in (401, 403):
            return SourceUnavailable(
                f"MLflow server {self.tracking_uri} refused access (HTTP {status}); give the "
                f"bot MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME and _PASSWORD")
        first_line = exc.message.strip().splitlines()[0] if exc.message.strip() else exc.error_code
        return SourceUnavailable(f"MLflow server {self.tracking_uri} answered with an error: "
                                 f"{first_line[:300]}")

    def _resolve_experiment(self, client: MlflowClient) -> str:
        """The experiment's id, by name first; kept once found (an id never changes)."""
        if self._experiment_id is not None:
            return self._experiment_id
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is None and self.experiment.isdigit():
            from mlflow.exceptions import MlflowException

            try:
                experiment = client.get_experiment(self.experiment)
            except MlflowException as exc:  # no such id either: reported as missing below
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
        if experiment is None:
            raise SourceMissing(f"{self._uri}: the server has no experiment {self.experiment!r} "
                                f"(yet); check the name or create it")
        if experiment.lifecycle_stage == "deleted":
            raise SourceMissing(f"{self._uri}: experiment {self.experiment!r} was deleted; "
                                f"restore it or watch another one")
        self._experiment_id = experiment.experiment_id
        return experiment.experiment_id

    @staticmethod
    def _search(client: MlflowClient, experiment_id: str) -> list[Run]:
        # Deleted runs come too, so that a name stays with the same run when another is deleted.
        from mlflow.entities import ViewType

        runs: list[Run] = []
        token = None
        while True:
            page = client.search_runs([experiment_id], run_view_type=ViewType.ALL,
                                      max_results=SEARCH_PAGE, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def history(self, client: MlflowClient, run_id: str, key: str, offset: int) -> list[Metric]:
        """A metric's history from ``offset`` on, in the server's (timestamp, step) order.

        The public ``get_metric_history`` always starts at the first point; the client's store
        takes the server's offset page token (the format MLflow's own pages use), which is what
        makes a poll cost the new points rather than the whole history.
        """
        from mlflow.utils.search_utils import SearchUtils

        store = client._tracking_client.store
        token = SearchUtils.create_page_token(offset).decode() if offset else None
        points: list[Metric] = []
        while True:
            page = store.get_metric_history(run_id, key, max_results=HISTORY_PAGE,
                                            page_token=token)
            points.extend(page)
            token = page.token
            if not token:
                return points


def run_names(runs: list[Run], rename: str | None = None) -> dict[str, str]:
    """Run id → the name runwatch shows; the earliest run keeps a shared name.

    ``rename`` replaces the MLflow names (one run watched under the configured name).
    """
    names: dict[str, str] = {}
    taken: set[str] = set()
    for run in sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id)):
        name = rename or run.info.run_name or run.info.run_id[:8]
        if name in taken:
            name = f"{name}-{run.info.run_id[:8]}"
        taken.add(name)
        names[run.info.run_id] = name
    return names


class MlflowRun:
    """One MLflow run, as listed by the last ``discover()``."""

    def __init__(self, source: MlflowSource, run: Run, name: str) -> None:
        self.source = source
        self.run = name
        self.info = run.info
        self.data = run.data
        self.inputs = run.inputs
        self.latest = {m.key: [m.step, m.timestamp] for m in run.data.to_proto().metrics}

    @property
    def key(self) -> str:
        # Run ids are UUIDs: the cursor survives a change in how the server's URI is spelt.
        return f"mlflow:{self.info.run_id}"

    def __repr__(self) -> str:
        return f"MlflowRun({self.run!r}, {self.info.run_id!r})"

    def read(self, cursor: dict[str, Any] | None = None, *, final: bool = False) -> Batch:
        """Points logged since ``cursor``, in logged order, with the run's metadata.

        ``final`` looks at every key, whether or not the run listing says it moved.
        """
        cursor = dict(cursor or {})
        states: dict[str, dict[str, Any]] = dict(cursor.get("metrics", {}))
        status = self.info.status
        everything = final or not cursor or cursor.get("status") != status
        todo = [k for k in self.latest if everything or states.get(k, {}).get("latest")
                != self.latest[k]]
        batch = Batch(run=self.run, cursor={}, meta=self.meta(),
                      checkpoints=self.checkpoints())
        fetched: dict[str, list[Metric]] = {}
        with self.source.talking() as client:
            for key in todo:
                fetched[key] = self._read_key(client, key, states, batch)
            if status == "RUNNING" and states and not everything:
                # A resumed run logs lower steps again: the latest values do not move.
                probe = max(states, key=lambda k: states[k]["n"])
                if probe not in fetched:
                    fetched[probe] = self._read_key(client, probe, states, batch)
                    if fetched[probe]:
                        for key in self.latest.keys() - fetched.keys():
                            fetched[key] = self._read_key(client, key, states, batch)
        batch.points = self._frame(fetched, batch)
        batch.cursor = {"run_id": self.info.run_id, "status": status, "metrics": states}
        return batch

    def _read_key(self, client: MlflowClient, key: str, states: dict[str, dict[str, Any]],
                  batch: Batch) -> list[Metric]:
        """New points of one key; advances ``states[key]``."""
        from mlflow.exceptions import MlflowException

        state = states.get(key, {"n": 0})
        seen = state["n"]
        try:
            page = self.source.history(client, self.info.run_id, key, max(seen - 1, 0))
        except MlflowException as exc:  # a backend with other page tokens: read it all
            if exc.error_code != "INVALID_PARAMETER_VALUE" or not seen:
                raise
            page = []
        if not seen:
            new = page
        elif page and _point_id(page[0]) == [state["ts"], state["step"], state["v"]]:
            new = page[1:]
        else:
            new, cut = self._after(client, key, state)
            if cut > seen:
                batch.notices.append(
                    f"{self.run}: {cut - seen} point(s) of {key!r} arrived with timestamps "
                    f"before points already read (two clocks logging one metric?); skipped")
            seen = cut
        if new:
            ts, step, value = _point_id(new[-1])
            state = {"n": seen + len(new), "ts": ts, "step": step, "v": value}
        else:
            state = {**state, "n": seen}
        state["latest"] = self.latest.get(key)
        states[key] = state
        return new

    def _after(self, client: MlflowClient, key: str,
               state: dict[str, Any]) -> tuple[list[Metric], int]:
        """When points were inserted before the cursor, or the server takes no offset: the
        whole history, split after the cursor's point. Returns the points after it and how
        many points precede them."""
        history = sorted(client.get_metric_history(self.info.run_id, key),
                         key=lambda m: (m.timestamp, m.step))
        cut = bisect.bisect_right([(m.timestamp, m.step) for m in history],
                                  (state["ts"], state["step"]))
        return history[cut:], cut

    def _frame(self, fetched: dict[str, list[Metric]], batch: Batch) -> pd.DataFrame:
        """One long frame in logged order; of two points of a tag at one step, the last."""
        rows: list[tuple[int, int, str, float]] = []
        for key, points in fetched.items():
            tag = self.source.aliases.canonical(key)
            if tag in (STEP, TIME):  # the x axis, logged as a metric by some trainers
                continue
            for m in points:
                if m.step < 0:
                    batch.skipped_values += 1
                    continue
                value = m.value
                if abs(value) == FLOAT_MAX:
                    value = float("inf") if value > 0 else float("-inf")
                rows.append((m.timestamp, m.step, tag, value))
        if not rows:
            return empty_points()
        rows.sort(key=lambda r: (r[0], r[1]))
        kept: list[tuple[int, int, str, float] | None] = list(rows)
        previous: dict[str, int] = {}
        for i, (_, step, tag, _) in enumerate(rows):
            j = previous.get(tag)
            if j is not None and rows[j][1] == step:
                kept[j] = None
            previous[tag] = i
        frame = pd.DataFrame([(step, tag, value, ts / 1000) for ts, step, tag, value in
                              filter(None, kept)], columns=METRIC_COLUMNS)
        return frame.astype({"step": "int64", "value": "float64", "wall_time": "float64"})

    def meta(self) -> dict[str, Any]:
        """Hyperparameters, status, data version and environment, as the run has them."""
        params = dict(self.data.params)
        tags = self.data.tags
        meta: dict[str, Any] = {"config": params, "status": self.info.status,
                                "mlflow_run_id": self.info.run_id,
                                "mlflow_experiment_id": self.info.experiment_id}
        if self.info.start_time:
            meta["started_at"] = self.info.start_time / 1000
        if self.info.end_time:
            meta["ended_at"] = self.info.end_time / 1000
        for name in TOTAL_STEP_PARAMS:
            total = _positive_int(params.get(name))
            if total:
                meta["total_steps"] = total
                break
        if tags.get("mlflow.note.content"):
            meta["note"] = tags["mlflow.note.content"]
        version = next((d.get(k) for k in DATA_VERSION_KEYS for d in (params, tags) if d.get(k)),
                       None)
        if version:
            meta["data_version"] = version
        datasets = [{"name": i.dataset.name, "digest": i.dataset.digest,
                     "context": next((t.value for t in i.tags if t.key == "mlflow.data.context"),
                                     None)}
                    for i in (self.inputs.dataset_inputs if self.inputs else [])]
        if datasets:
            meta["datasets"] = datasets
        environment = {name: tags[tag] for tag, name in ENVIRONMENT_TAGS.items() if tags.get(tag)}
        if environment:
            meta["environment"] = environment
        user_tags = {k: v for k, v in tags.items() if not k.startswith("mlflow.")}
        if user_tags:
            meta["tags"] = user_tags
        return meta

    def checkpoints(self) -> list[Checkpoint]:
        """``checkpoint-<step>`` artifact folders, when the artifacts are on a local disk.

        Remote artifact stores (``mlflow-artifacts:``, ``s3:``…) are not listed: a rollback
        needs a path the training process can load, and the bot forgets checkpoints whose
        path does not exist on its disk.
        """
        parts = urlsplit(self.info.artifact_uri or "")
        if parts.scheme not in ("", "file"):
            return []
        return sorted(iter_checkpoint_dirs(Path(url2pathname(parts.path))), key=lambda c: c.step)


def _point_id(metric: Metric) -> list[Any]:
    """Where a point sits in the server's order; the value as ``repr`` keeps NaN in JSON."""
    return [metric.timestamp, metric.step, repr(metric.value)]


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(float(value)) if value is not None else None
    except ValueError:
        return None
    return number if number and number > 0 else None


def open_source(target: str, run: str | None = None,
                aliases: AliasTable | None = None) -> MlflowSource:
    """The ``mlflow://`` scheme. ``run`` (from the configuration) picks one run by name or id
    when the URI has no ``&run=``, and is the name runwatch shows for the watched run.

    Nothing is asked of the server here: a configuration is valid while the server is down.
    """
    tracking_uri, experiment, selected = parse_target(target)
    if importlib.util.find_spec("mlflow") is None:
        raise ValueError("mlflow:// sources need the MLflow client: pip install mlflow-skinny")
    return MlflowSource(tracking_uri, experiment, run=selected or run, name=run,
                        aliases=aliases, uri=f"mlflow://{target}")
