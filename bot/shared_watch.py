"""One of several instances sharing a store: leases, ingest, a non-finite alert, exactly-once
sends. What two instances on PostgreSQL run in the failover test and ``runwatch bench store``.

Each pass: renew this instance's run leases and take free or expired ones (a fair share);
read each owned run's JSONL log from its stored cursor and store the points with the cursor,
holding the lease in the same transaction; judge the owned runs with new points (a NaN or
infinite value queues one alert per run, in the transaction that marks the run judged);
then send what is queued for the owned runs, each row claimed first. A row another instance
was sending when it died is settled by asking the receiver whether it has the row's key,
then recorded or sent again.

The full engine (analyzers, alert lifecycle, Slack) runs on PostgreSQL as one
``runwatch serve`` a database; it takes no leases yet, so several instances are this
watcher's: ``python -m bot.shared_watch --help``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from bot.pgstore import open_store
from bot.store import LeaseLost
from connectors.files import LogFile

log = logging.getLogger("runwatch.shared")


class SharedWatcher:
    def __init__(self, store: Any, folder: Path, instance: str, *, interval: float,
                 post_url: str) -> None:
        self.store = store
        self.folder = folder
        self.instance = instance
        self.interval = interval
        self.post_url = post_url.rstrip("/")
        self.http = httpx.Client(timeout=10)
        self.runs: list[str] = []
        self.held: set[str] = set()
        self.renewed = -math.inf
        self.stop = threading.Event()

    def run_forever(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            self.one_pass()
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - began)))
        self.store.release_leases(self.instance)

    def _renew(self, *, due: bool = False) -> set[str]:
        """The runs this instance holds, the leases renewed at the pass's start and every
        half interval within it: a pass longer than the leases must not lose them under
        itself. Two intervals: a dead instance's runs are free two polls after its last
        renewal."""
        if due or time.monotonic() - self.renewed > self.interval / 2:
            held = set(self.store.acquire_leases(self.instance, self.runs,
                                                 ttl=2 * self.interval))
            taken = sorted(held - self.held)
            if taken:
                log.info("%s took %d runs (%s…)", self.instance, len(taken), taken[0])
            self.held, self.renewed = held, time.monotonic()
        return self.held

    def one_pass(self) -> None:
        self.runs = sorted(p.stem for p in self.folder.glob("*.jsonl"))
        owned = sorted(self._renew(due=True))
        for run in owned:
            if self.stop.is_set():
                return
            if run not in self._renew():
                continue
            reader = LogFile(self.folder / f"{run}.jsonl", run, discover_checkpoints=False)
            # read now, not at the pass's start: another instance may have held the run since
            cursor = self.store.cursor(reader.key)
            batch = reader.read(cursor)
            if batch.points.empty and batch.cursor == cursor:
                continue
            try:
                self.store.ingest(run=run, source="file", log_path=reader.key,
                                  cursor_key=reader.key, cursor=batch.cursor,
                                  points=batch.points, checkpoints=[], meta=batch.meta,
                                  malformed=batch.malformed,
                                  skipped_values=batch.skipped_values, notices=batch.notices,
                                  owner=self.instance)
            except LeaseLost as exc:
                log.warning("%s", exc)
        for run in sorted(set(self.store.unjudged()) & set(owned)):
            if self.stop.is_set():
                return
            if run in self._renew():
                self._judge(run)
        self._settle_in_doubt(owned)
        self._send(owned)

    def _judge(self, run: str) -> None:
        data = self.store.run_data(run)
        values = data.metrics["value"].to_numpy(dtype=float)
        bad = data.metrics[~(values == values) | (abs(values) == math.inf)]
        alert = {"kind": "alert", "fingerprint": f"{run}|nonfinite", "run": run,
                 "channel": "#training", "now": time.time()}
        try:
            self.store.judged(run, owner=self.instance, queue=alert if len(bad) else None)
        except LeaseLost as exc:
            log.warning("%s", exc)

    def _settle_in_doubt(self, owned: list[str]) -> None:
        """Rows left 'sending' by a dead instance (no heartbeat for two intervals) whose
        run this one now owns. A live one that handed the run over finishes its own send."""
        doubtful = self.store.sending_outbox()
        if not doubtful:
            return
        now = self.store.clock()
        live = {instance for instance, seen_at in self.store.instances().items()
                if seen_at >= now - 2 * self.interval}
        for row in doubtful:
            if row["run"] not in owned or row["claimed_by"] in live | {self.instance}:
                continue
            if not self.store.claim_outbox(row["id"], self.instance,
                                           in_doubt_of=row["claimed_by"]):
                continue
            found = self.http.get(f"{self.post_url}/find", params={"key": _key(row)})
            if found.status_code == 200:
                self._record(row, found.json()["ts"])
            else:
                self.store.update_outbox(row["id"], state="pending")

    def _send(self, owned: list[str]) -> None:
        for row in self.store.pending_outbox():
            if row["run"] not in owned or row["run"] not in self._renew() or self.stop.is_set():
                continue
            if not self.store.claim_outbox(row["id"], self.instance):
                continue  # another instance claimed it first
            posted = self.http.post(f"{self.post_url}/post",
                                    json={"key": _key(row), "run": row["run"],
                                          "text": f"{row['run']}: a non-finite value"})
            if posted.status_code == 200:
                self._record(row, posted.json()["ts"])
            else:
                self.store.update_outbox(row["id"], state="pending",
                                         last_error=f"HTTP {posted.status_code}")

    def _record(self, row: dict[str, Any], ts: str) -> None:
        self.store.record_sent(row["id"], channel=row["channel"], ts=ts,
                               fingerprint=row["fingerprint"], run=row["run"],
                               kind=row["kind"], now=time.time())
        log.info("%s sent %s for run %s", self.instance, row["kind"], row["run"])


class Receiver(ThreadingHTTPServer):
    """A local stand-in for the chat transport: keeps every post (duplicates included, to be
    counted) and answers ``GET /find?key=`` as Slack's history search answers the outbox."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.posts_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ReceiverHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ReceiverHandler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.posts_lock:
            self.server.posts.append(body)
            ts = str(len(self.server.posts))
        self._answer(200, {"ts": ts})

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        key = parse_qs(urlsplit(self.path).query).get("key", [""])[0]
        with self.server.posts_lock:
            found = [i for i, p in enumerate(self.server.posts) if p["key"] == key]
        self._answer(200 if found else 404, {"ts": str(found[0] + 1)} if found else {})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def _key(row: dict[str, Any]) -> str:
    return f"{row['id']}-{row['created_at']:.6f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bot.shared_watch", description=__doc__)
    parser.add_argument("--store", required=True, help="postgresql://… URL or SQLite file")
    parser.add_argument("--folder", required=True, help="folder of <run>.jsonl logs")
    parser.add_argument("--instance", required=True, help="this instance's unique name")
    parser.add_argument("--interval", type=float, default=5.0, help="poll interval, s")
    parser.add_argument("--post-url", required=True, help="receiver: POST /post, GET /find")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    watcher = SharedWatcher(open_store(args.store), Path(args.folder), args.instance,
                            interval=args.interval, post_url=args.post_url)
    signal.signal(signal.SIGTERM, lambda *_: watcher.stop.set())
    watcher.run_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
