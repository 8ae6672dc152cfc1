"""A throwaway PostgreSQL server for tests, benchmarks and trying harnessrl on PostgreSQL locally.

``ThrowawayPostgres`` runs ``initdb`` into a temporary folder, starts ``postgres`` on a free
loopback port with trust authentication, and deletes everything when its ``with`` block ends::

    with ThrowawayPostgres() as server:
        server.create_database("run1")
        store = open_store(server.url("run1"))

Why it looks the way it does:
- ``initdb`` refuses to run as root, so as root the cluster belongs to the ``postgres`` OS user
  (Debian's package creates it; we create it when missing) and the server runs as that user.
- Durability settings (``fsync=off``, ``full_page_writes=off``) are off for speed: the data folder
  is deleted at the end anyway, and the ``Store`` contract is about surviving a *client* process
  being killed, which these settings do not touch.
- Only 127.0.0.1 and a private Unix-socket folder are listened on; nothing else can connect.
- ``pg_ctl`` starts the server as a daemon, which outlives whoever started it. So a *reaper* (this
  module with ``--reap``, in a session of its own) waits on a pipe only the owner holds: when the
  owner ends without ``stop()`` (SIGTERM, SIGKILL, a crash), the pipe closes and the reaper stops
  the server and deletes its folder. ``stop()`` does both itself and ends the reaper.

``server_for_tests()`` is what test suites use: the server named by ``HARNESSRL_TEST_PG_URL`` when set,
else a throwaway one (installing Debian's ``postgresql`` package first when allowed).

Run ``python -m harnessrl.store.pg_server`` to get a throwaway server until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from harnessrl.errors import HarnessRLError

TEST_URL_ENV = "HARNESSRL_TEST_PG_URL"
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class PostgresUnavailable(HarnessRLError):
    """No PostgreSQL server can be had here (binaries missing and not installable, or no driver)."""


def find_bindir() -> Path | None:
    """The folder holding ``initdb``/``pg_ctl``: ``HARNESSRL_PG_BINDIR``, Debian's newest
    ``/usr/lib/postgresql/N/bin``, or wherever ``pg_ctl`` is on ``PATH``."""
    candidates: list[Path] = []
    if os.environ.get("HARNESSRL_PG_BINDIR"):
        candidates.append(Path(os.environ["HARNESSRL_PG_BINDIR"]))
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = [p for p in debian.iterdir() if p.name.isdigit()]
        candidates += [p / "bin" for p in sorted(versions, key=lambda p: int(p.name), reverse=True)]
    on_path = shutil.which("pg_ctl")
    if on_path:
        # Debian's /usr/bin/pg_ctl (if any) is a wrapper script; follow links to the real folder.
        candidates.append(Path(on_path).resolve().parent)
    for bindir in candidates:
        if all((bindir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def install_postgres() -> None:
    """``apt-get install postgresql`` (root with apt-get only); raises ``PostgresUnavailable`` otherwise."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PostgresUnavailable("PostgreSQL is not installed and this is not root with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "postgresql"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}")


class PostgresServer:
    """A server reachable at ``base_url`` (any database on it, as a superuser); makes databases."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def url(self, dbname: str) -> str:
        """``base_url`` with its database swapped for ``dbname``."""
        parts = urlsplit(self.base_url)
        return urlunsplit(parts._replace(path="/" + dbname))

    def create_database(self, name: str) -> str:
        """Create an empty database (dropping one of that name first); returns its URL."""
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{_check_name(name)}" WITH (FORCE)')
            # FILE_COPY (PostgreSQL 15+) copies the template's files instead of WAL-logging every
            # block: ~10x faster here (0.06 s vs 0.6 s on a loaded 2-core machine) with fsync off.
            strategy = " STRATEGY FILE_COPY" if conn.info.server_version >= 150000 else ""
            conn.execute(f'CREATE DATABASE "{name}"{strategy}')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting whoever is still on it."""
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{_check_name(name)}" WITH (FORCE)')

    @contextlib.contextmanager
    def _admin(self) -> Iterator[Any]:
        try:
            import psycopg
        except ImportError as exc:
            raise PostgresUnavailable("psycopg is not installed: pip install 'harnessrl[postgres]'") from exc
        # CREATE/DROP DATABASE cannot run inside a transaction block, hence autocommit. Names are
        # checked by _check_name before they are put into the statements.
        with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=30) as conn:
            yield conn


def _check_name(name: str) -> str:
    if not _DB_NAME.fullmatch(name):
        raise ValueError(f"database name {name!r} must be lowercase letters, digits and _ (max 63)")
    return name


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _postgres_user() -> dict[str, Any]:
    """subprocess keyword arguments that run a command as the ``postgres`` OS user (created if missing)."""
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres"],
            check=True,
            capture_output=True,
        )
    entry = pwd.getpwnam("postgres")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


class ThrowawayPostgres(PostgresServer):
    """A fresh PostgreSQL cluster in a temporary folder, for the length of a ``with`` block."""

    def __init__(self, bindir: Path | None = None, *, start_timeout_s: float = 120.0) -> None:
        found = bindir or find_bindir()
        if found is None:
            raise PostgresUnavailable(
                "PostgreSQL binaries (initdb, pg_ctl) not found; apt-get install postgresql"
            )
        self.bindir = found
        self.start_timeout_s = start_timeout_s
        self.folder: Path | None = None
        self.port: int | None = None
        self.startup_s: float | None = None  # how long initdb + start took
        self._reaper: subprocess.Popen[bytes] | None = None  # cleans up if this process dies first
        super().__init__("")

    def __enter__(self) -> ThrowawayPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self, *args: str | Path) -> None:
        as_user = _postgres_user() if os.geteuid() == 0 else {}
        # LC_ALL=C: initdb fails on a locale the machine lacks; the test cluster needs none.
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        done = subprocess.run(
            [str(a) for a in args],
            env=env,
            capture_output=True,
            text=True,
            timeout=self.start_timeout_s,
            **as_user,
        )
        if done.returncode != 0:
            log = ""
            if self.folder is not None and (self.folder / "server.log").is_file():
                log = (self.folder / "server.log").read_text(errors="replace")[-3000:]
            raise PostgresUnavailable(
                f"{Path(args[0]).name} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}{log}"
            )

    def start(self) -> None:
        started = time.monotonic()
        self.folder = Path(tempfile.mkdtemp(prefix="harnessrl-pg-"))
        try:
            self._reaper = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "harnessrl.store.pg_server",
                    "--reap",
                    str(self.bindir),
                    str(self.folder),
                ],
                stdin=subprocess.PIPE,
                # Not the owner's stdout/stderr: whoever reads those to their end must not wait on it.
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C to the owner's process group must not end it first
            )
            self._init_and_start(self.folder)
        except BaseException:
            self.stop()  # never leave a half-made cluster (or its server) behind
            raise
        self.base_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.startup_s = time.monotonic() - started

    def _init_and_start(self, folder: Path) -> None:
        if os.geteuid() == 0:
            user = _postgres_user()
            os.chown(folder, user["user"], user["group"])
        data = folder / "data"
        self._run(
            self.bindir / "initdb", "-D", data, "--username=postgres", "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions",
        )  # fmt: skip
        # Another process can take the port between _free_port and the server's bind: retry.
        for tries_left in range(2, -1, -1):
            self.port = _free_port()
            options = " ".join(
                [
                    f"-p {self.port}",
                    "-c listen_addresses=127.0.0.1",
                    f"-c unix_socket_directories={folder}",
                    "-c fsync=off",
                    "-c full_page_writes=off",
                    "-c synchronous_commit=off",
                    "-c max_connections=300",
                    "-c shared_buffers=64MB",
                ]
            )
            try:
                self._run(
                    self.bindir / "pg_ctl", "start", "-D", data, "-l", folder / "server.log",
                    "-w", "-t", str(int(self.start_timeout_s)), "-o", options,
                )  # fmt: skip
                return
            except PostgresUnavailable:
                if not tries_left:
                    raise

    def restart(self) -> None:
        """Stop and start the server on the same data and port (fast shutdown: clients are cut off)."""
        if self.folder is None:
            raise RuntimeError("the server is not running")
        # -l: without a log file the server would keep pg_ctl's captured stdout open forever.
        self._run(
            self.bindir / "pg_ctl", "restart", "-D", self.folder / "data", "-l", self.folder / "server.log",
            "-m", "fast", "-w", "-t", str(int(self.start_timeout_s)),
        )  # fmt: skip

    def stop(self) -> None:
        if self.folder is not None:
            folder, self.folder = self.folder, None
            self._stop_and_delete(folder)
        reaper, self._reaper = self._reaper, None
        if reaper is not None:  # nothing left for it to do
            reaper.kill()
            reaper.wait()
            if reaper.stdin is not None:
                reaper.stdin.close()

    def _stop_and_delete(self, folder: Path) -> None:
        pid_file = folder / "data" / "postmaster.pid"
        if pid_file.is_file():
            # pg_ctl -m immediate: no shutdown checkpoint, the data is thrown away anyway. Signal the
            # postmaster ourselves if pg_ctl cannot (e.g. it already died and left the pid file).
            try:
                self._run(self.bindir / "pg_ctl", "stop", "-D", folder / "data", "-m", "immediate", "-w")
            except (PostgresUnavailable, subprocess.TimeoutExpired):
                with contextlib.suppress(ValueError, OSError):
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGQUIT)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def server_for_tests(*, install: bool = True) -> Iterator[PostgresServer]:
    """The server tests should use: ``HARNESSRL_TEST_PG_URL`` (a superuser URL; a database is made
    per test) when set, else a ``ThrowawayPostgres``, installing PostgreSQL first if ``install``
    and it is missing. Raises ``PostgresUnavailable`` when neither works."""
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise PostgresUnavailable("psycopg is not installed: pip install 'harnessrl[postgres]'") from exc
    if os.environ.get(TEST_URL_ENV):
        yield PostgresServer(os.environ[TEST_URL_ENV])
        return
    if find_bindir() is None and install:
        install_postgres()
    with ThrowawayPostgres() as server:
        yield server


def _reap(bindir: str, folder: str) -> None:
    """The reaper: once its owner's pipe closes (the owner ended, however), stop the server that
    runs on ``folder`` and delete the folder (nothing is left to do if ``stop()`` ran)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdin.buffer.read()
    ThrowawayPostgres(Path(bindir))._stop_and_delete(Path(folder))


def main() -> None:
    if sys.argv[1:2] == ["--reap"]:
        _reap(*sys.argv[2:4])
        return
    with ThrowawayPostgres() as server:
        server.create_database("harnessrl")
        print(f"PostgreSQL ready in {server.startup_s:.1f} s: {server.url('harnessrl')}", flush=True)
        print(
            "store.url above works for harnessrl; Ctrl-C stops the server and deletes its data.", flush=True
        )
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
