"""A local PostgreSQL server for tests, benchmarks and trying several instances: started in
a temporary folder, stopped by its PID (``python -m benchmarks.devpostgres`` prints its URL).

Uses the server binaries on PATH (Debian's ``postgresql`` package puts them in
``/usr/lib/postgresql/<version>/bin``); tests that need one are skipped, saying why, where
there is none. PostgreSQL refuses to run as root: as root, the server runs as the
``postgres`` user through ``setpriv`` (which execs, so the PID is the server's own).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def binaries() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Postgres:
    process: subprocess.Popen
    port: int
    folder: Path

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://runwatch@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start_postgres() -> Postgres:
    """initdb and start a server on a free local port; raises RuntimeError if it cannot."""
    bin_dir = binaries()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb) on this machine")
    folder = Path(tempfile.mkdtemp(prefix="runwatch-pg-"))
    data = folder / "data"
    prefix: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        prefix = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                  "--init-groups", "--"]
    done = subprocess.run([*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", "runwatch",
                           "--auth=trust", "-E", "UTF8", "--no-sync"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {done.stderr.strip()[-500:]}")
    port = _free_port()
    log = open(folder / "server.log", "w")  # noqa: SIM115 - the server writes it until stop
    process = subprocess.Popen(
        [*prefix, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port),
         "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
         "-c", "fsync=off", "-c", "max_connections=50"],
        stdout=log, stderr=subprocess.STDOUT)
    server = Postgres(process, port, folder)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited: {(folder / 'server.log').read_text()[-500:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.1)
    import psycopg

    while True:
        try:
            psycopg.connect(server.url(), connect_timeout=2).close()
            return server
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.1)


def main() -> int:
    server = start_postgres()
    print(f"PostgreSQL on {server.url('postgres')} (data in {server.folder}); Ctrl-C stops it",
          flush=True)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
