"""What is particular to ``PostgresStore`` beyond the shared contract: URL forms, config, connection
errors, a pool smaller than the number of threads, fork safety, a server restart under an open
store, the ``ThrowawayPostgres`` helper itself, and a real gateway process recording into PostgreSQL."""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import StoreConfig, load_raw_config, resolve_relative_paths, validate_config
from harnessrl.errors import ConfigError, HarnessRLError, UpstreamError
from harnessrl.schemas import Call, Outcome, RolloutStatus
from harnessrl.store import open_store
from harnessrl.store.pg_server import PostgresServer, ThrowawayPostgres, find_bindir, server_for_tests

if os.environ.get("CI") != "true":  # CI must have the driver: there a missing one fails collection
    pytest.importorskip("psycopg", reason="needs harnessrl[postgres]")
from harnessrl.store.postgres import PostgresStore, redact  # noqa: E402  (needs psycopg)


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield pg_server.create_database(name)
    pg_server.drop_database(name)


def a_call(rollout_id: str, n: int = 0) -> Call:
    return Call(
        rollout_id=rollout_id, prompt_token_ids=[n], response_token_ids=[n + 1], response_logprobs=[-1.0]
    )


def test_open_store_urls(pg_url: str) -> None:
    for url in (pg_url, pg_url.replace("postgresql://", "postgres://", 1), pg_url + "?application_name=hrl"):
        store = open_store(url)
        assert isinstance(store, PostgresStore)
        assert not store.reads_at_once  # a server round trip: the gateway reads keys in a thread
        rollout = store.create_rollout()
        assert store.add_call_now(a_call(rollout.rollout_id)) is None  # and writes in its writer thread
        store.close()
    with PostgresStore(pg_url) as store:
        assert store.count_rollouts() == 3  # all three URLs reached the same database
        assert store.count_calls() == 0


@pytest.mark.parametrize("url", ["mysql://u@h/db", "sqlite+pysqlite://x", ""])
def test_unknown_store_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="store url"):
        open_store(url)


def test_store_config_keeps_a_postgres_url(tmp_path: Path) -> None:
    url = "postgresql://hrl:s3cret@db.internal:5432/harnessrl?sslmode=require"
    config = tmp_path / "c.toml"
    config.write_text(f'[store]\nurl = "{url}"\n[harness]\ncommand = ["./run.sh"]\n')
    raw = resolve_relative_paths(load_raw_config(config), tmp_path)
    assert validate_config(StoreConfig, raw["store"]).url == url
    env = {"HARNESSRL_STORE__URL": url}  # the env override path parses values as TOML scalars
    assert load_raw_config(None, env=env)["store"]["url"] == url
    assert load_raw_config(None, [f"store.url={url}"], env={})["store"]["url"] == url


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens here once the socket is closed


def test_unreachable_server_is_an_upstream_error_without_the_password() -> None:
    url = f"postgresql://hrl:s3cret@127.0.0.1:{_closed_port()}/db"
    with pytest.raises(UpstreamError, match="cannot use PostgreSQL store") as excinfo:
        PostgresStore(url, timeout_s=5)
    assert "s3cret" not in str(excinfo.value) and "hrl:***@127.0.0.1" in str(excinfo.value)
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://hrl@127.0.0.1:{port}/db?password=s3cret&connect_timeout=5",  # libpq's query form
        "postgresql://hrl:s3cret@[::1/db",  # libpq quotes a URL it cannot parse in its message
        "postgresql://hrl:s3cret@127.0.0.1:notaport/db",  # redacting it raised ValueError
        "postgresql://hrl:s3%40cret@127.0.0.1:{port}/db?connect_timeout=5",  # percent-encoded
        # The SSL key's passphrase, and a parameter name percent-encoded (libpq decodes names too),
        # were shown as written.
        "postgresql://hrl@127.0.0.1:{port}/db?sslmode=disable&sslpassword=s3cret&connect_timeout=5",
        "postgresql://hrl@127.0.0.1:{port}/db?connect_timeout=5&pass%77ord=s3cret",
    ],
)
def test_a_password_never_reaches_an_error_message(url: str) -> None:
    """The password was removed from ``user:password@`` only: one given as ``?password=`` was shown,
    a URL libpq could not parse was quoted whole in its ``ProgrammingError``, and a port that is not
    a number made the redaction itself raise ``ValueError``. Every one is now a ``HarnessRLError``
    naming the store with the password as ``***``."""
    url = url.format(port=_closed_port())
    with pytest.raises(HarnessRLError, match="PostgreSQL store postgresql://hrl") as excinfo:
        PostgresStore(url, timeout_s=5)
    message = str(excinfo.value)
    assert "s3cret" not in message and "s3@cret" not in message and "***" in message
    assert excinfo.value.__cause__ is None  # the driver's own message (with the URL) is not chained
    assert redact(url) in message
    assert "s3cret" not in redact(url) and "s3%40cret" not in redact(url)


def test_a_user_who_cannot_create_the_tables_gets_a_config_error(pg_server: PostgresServer) -> None:
    """PostgreSQL 15 lets only a database's owner create tables in ``public``: a store opened by
    another user failed with psycopg's ``InsufficientPrivilege`` (a traceback from every CLI), not a
    ``ConfigError`` naming the store."""
    import psycopg

    name, role = f"t_{uuid.uuid4().hex[:16]}", f"r_{uuid.uuid4().hex[:16]}"
    url = pg_server.create_database(name)
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
    with psycopg.connect(url, autocommit=True) as owner:  # PostgreSQL 15's default, on any version
        owner.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    try:
        weak = re.sub(r"//[^@/]*@", f"//{role}@", url, count=1)
        assert weak != url
        with pytest.raises(ConfigError, match=f"cannot use PostgreSQL store .*{role}.*permission denied"):
            PostgresStore(weak, timeout_s=30)
        with psycopg.connect(url, autocommit=True) as owner:  # the control: with the right, it opens
            owner.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
        with PostgresStore(weak, timeout_s=30) as store:
            assert store.create_rollout(rollout_id="r").rollout_id == "r"
    finally:
        pg_server.drop_database(name)
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_user_who_may_only_read_and_write_rows_opens_a_migrated_store(pg_server: PostgresServer) -> None:
    """Every open ran ``CREATE TABLE IF NOT EXISTS meta``, which PostgreSQL refuses to a user without
    the right to create tables even when the table exists: a store its owner had migrated could not
    be opened by a role granted only SELECT/INSERT/UPDATE/DELETE on its tables (a ``ConfigError``,
    "permission denied for schema public"). Such a role now opens it and records; one that would
    have to migrate it still gets the ``ConfigError``."""
    import psycopg

    name, role = f"t_{uuid.uuid4().hex[:16]}", f"r_{uuid.uuid4().hex[:16]}"
    url = pg_server.create_database(name)
    weak = re.sub(r"//[^@/]*@", f"//{role}@", url, count=1)
    assert weak != url
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
    try:
        with psycopg.connect(url, autocommit=True) as owner:
            owner.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        with pytest.raises(ConfigError, match="permission denied"):  # the control: nothing to use yet
            PostgresStore(weak, timeout_s=30)
        with PostgresStore(url, timeout_s=30) as store:  # the owner creates the tables
            rollout = store.create_rollout(rollout_id="r")
        with psycopg.connect(url, autocommit=True) as owner:
            owner.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
        with PostgresStore(weak, timeout_s=30) as store:
            assert store.get_rollout_by_key(rollout.api_key).rollout_id == "r"
            assert store.add_call(a_call("r")).seq == 0
            assert [c.seq for c in store.list_calls("r")] == [0]
    finally:
        pg_server.drop_database(name)
        with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def test_missing_database_is_an_upstream_error(pg_server: PostgresServer) -> None:
    with pytest.raises(UpstreamError, match="does not exist"):
        PostgresStore(pg_server.url("no_such_db"))


@contextlib.contextmanager
def database_with_encoding(pg_server: PostgresServer, encoding: str) -> Iterator[str]:
    """A fresh database of ``encoding`` (``C`` locale, which every encoding accepts); its URL."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE {name} ENCODING '{encoding}' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'"
        )
    try:
        yield pg_server.url(name)
    finally:
        pg_server.drop_database(name)


def test_a_sql_ascii_database_keeps_utf8_text_byte_for_byte(pg_server: PostgresServer) -> None:
    """Under SQL_ASCII the client encoding defaults to the database's, and psycopg then hands text
    back as bytes: every read failed (``b'queued' is not a valid RolloutStatus``). Every connection
    of the store talks UTF-8, whatever the URL says, and SQL_ASCII keeps those bytes as they are."""
    with database_with_encoding(pg_server, "SQL_ASCII") as url:
        call = a_call("é-1").model_copy(
            update={
                "request": {"messages": [{"role": "user", "content": "ünï ✓ 😀"}]},
                "response": {"x": "ß"},
            }
        )
        with PostgresStore(url) as store:
            assert store.create_rollout(rollout_id="r-ascii").status is RolloutStatus.QUEUED
            store.create_rollout(rollout_id="é-1", task={"prompt": "héllo ✓"}, group_id="grüppe")
            store.start_rollout("é-1")
            written = store.add_call(call)
            done = store.finish_rollout("é-1", Outcome.INFRA_FAILURE, 0.0, error="évaluateur: ✗ 😀")
        with PostgresStore(url + "?client_encoding=latin1") as store:  # the URL cannot change it
            assert store.get_rollout("é-1") == done and done.error == "évaluateur: ✗ 😀"
            assert done.task == {"prompt": "héllo ✓"} and done.status is RolloutStatus.FAILED
            assert store.list_rollouts(group_id="grüppe") == [done]
            assert store.list_calls("é-1") == [written]


def test_a_database_whose_encoding_cannot_hold_every_text_is_refused_at_open(
    pg_server: PostgresServer,
) -> None:
    """LATIN1 (or any encoding but UTF8 and SQL_ASCII) would refuse a call quoting text outside it,
    long after the store opened: it is refused at open, saying how to make one that works."""
    with (
        database_with_encoding(pg_server, "LATIN1") as url,
        pytest.raises(ConfigError, match=r"has encoding LATIN1.*ENCODING 'UTF8'"),
    ):
        PostgresStore(url)


def test_pool_smaller_than_the_threads(pg_url: str) -> None:
    with PostgresStore(pg_url, max_connections=2) as store:
        rollout = store.create_rollout()
        errors: list[BaseException] = []

        def add(i: int) -> None:
            try:
                for n in range(10):
                    store.add_call(a_call(rollout.rollout_id, 100 * i + n))
            except BaseException as exc:  # re-raised below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors
        assert [c.seq for c in store.list_calls(rollout.rollout_id)] == list(range(80))


def _in_threads(n: int, target: Any) -> list[Any]:
    """``target(i)`` in n threads released together by a barrier; every result, or the first failure."""
    barrier = threading.Barrier(n)

    def released(i: int) -> Any:
        barrier.wait(timeout=60)
        return target(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(released, range(n)))


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_a_database_defaulting_to_a_stricter_isolation_keeps_every_concurrent_write(
    pg_url: str, isolation: str
) -> None:
    """A database (or role) whose ``default_transaction_isolation`` is stricter than READ COMMITTED:
    the store's locking still holds. Each statement must see what the lock's last holder committed;
    at the server's default, four stores opening the fresh database at once failed ("relation runs
    already exists"), two gateways took the same seq (a call lost to a unique violation) and claims
    failed with "could not serialize access"."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as admin:
        name = admin.info.dbname
        admin.execute(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation TO '{isolation}'")

    stores = _in_threads(4, lambda _: PostgresStore(pg_url, max_connections=2))  # four fresh opens
    try:
        rollout = stores[0].create_rollout()

        def add_calls(i: int) -> list[int]:
            return [stores[i].add_call(a_call(rollout.rollout_id, 100 * i + n)).seq for n in range(15)]

        seqs = _in_threads(4, add_calls)
        assert sorted(s for mine in seqs for s in mine) == list(range(60))
        assert [c.seq for c in stores[0].list_calls(rollout.rollout_id)] == list(range(60))

        made = {stores[0].create_rollout().rollout_id for _ in range(60)}

        def claim_all(i: int) -> list[str]:
            mine: list[str] = []
            while claimed := stores[i].claim_rollouts(f"w{i}", 2):
                mine += [r.rollout_id for r in claimed]
            return mine

        claimed = [rid for mine in _in_threads(4, claim_all) for rid in mine]
        assert len(claimed) == len(set(claimed)) and set(claimed) == made | {rollout.rollout_id}
    finally:
        for store in stores:
            store.close()


def _child_adds_a_call(store: PostgresStore, rollout_id: str) -> None:
    store.add_call(a_call(rollout_id, 1))


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_forked_child_opens_its_own_connections(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    rollout = store.create_rollout()
    store.add_call(a_call(rollout.rollout_id))
    child = multiprocessing.get_context("fork").Process(
        target=_child_adds_a_call, args=(store, rollout.rollout_id)
    )
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    # The parent's pooled connection still works: the child neither used nor closed it.
    assert [c.seq for c in store.list_calls(rollout.rollout_id)] == [0, 1]
    store.close()


@pytest.mark.skipif(find_bindir() is None, reason="needs PostgreSQL's binaries for a server of its own")
def test_throwaway_server_restart_under_an_open_store() -> None:
    with ThrowawayPostgres() as server:
        assert server.folder is not None and server.startup_s is not None
        folder = server.folder
        # Only loopback: the port answers on 127.0.0.1.
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
        url = server.create_database("restart")
        store = PostgresStore(url)
        rollout = store.create_rollout()
        store.add_call(a_call(rollout.rollout_id))
        server.restart()
        # The pool drops the connections the restart broke and lends fresh ones: no call fails.
        assert store.add_call(a_call(rollout.rollout_id, 1)).seq == 1
        assert [c.seq for c in store.list_calls(rollout.rollout_id)] == [0, 1]
        store.close()
    assert not folder.exists()  # the cluster is deleted with the block


_OWNER = """
import sys
from harnessrl.store.pg_server import ThrowawayPostgres
server = ThrowawayPostgres().__enter__()
print(server.folder, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that no init reaped has ended)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except ProcessLookupError:
        return False
    except OSError:  # no /proc: signal 0 said it exists
        return True
    return state != "Z"


@pytest.mark.skipif(find_bindir() is None, reason="needs PostgreSQL's binaries for a server of its own")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_throwaway_server_ends_with_its_owner_however_the_owner_ends(how: signal.Signals) -> None:
    """``pg_ctl`` daemonizes the server: an owner ended by a signal (``timeout`` around the test
    suite, a SIGTERM to ``python -m harnessrl.store.pg_server``) left the server running on its port
    and its cluster in /tmp, for good. Its reaper now stops both once the owner is gone."""
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    folder, postmaster = None, None
    try:
        assert owner.stdout is not None
        folder = Path(owner.stdout.readline().strip())
        postmaster = int((folder / "data" / "postmaster.pid").read_text().split()[0])
        assert _alive(postmaster)
        owner.send_signal(how)
        owner.wait(timeout=60)
        deadline = time.monotonic() + 120  # only ends a hung test
        while (_alive(postmaster) or folder.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(postmaster) and not folder.exists()
    finally:
        owner.kill()
        owner.wait()
        if postmaster is not None and _alive(postmaster):  # a failure's leftovers
            os.kill(postmaster, signal.SIGQUIT)
            deadline = time.monotonic() + 60
            while _alive(postmaster) and time.monotonic() < deadline:
                time.sleep(0.05)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def test_server_for_tests_uses_the_env_url(
    pg_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESSRL_TEST_PG_URL", pg_server.base_url)
    with server_for_tests() as server:
        assert not isinstance(server, ThrowawayPostgres) and server.base_url == pg_server.base_url
        url = server.create_database("t_from_env")
        assert url == pg_server.url("t_from_env")
        with PostgresStore(url) as store:
            assert store.count_rollouts() == 0
        server.drop_database("t_from_env")
    with pytest.raises(ValueError, match="database name"):
        server.create_database('x"; DROP DATABASE postgres; --')


@pytest.mark.timeout(180)
def test_gateway_process_records_into_postgres(pg_url: str, tmp_path: Path) -> None:
    """The real gateway CLI on a postgresql:// store: concurrent harness calls from worker threads
    land dense and in order, token-exact, readable from another process's store."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": ["Sure, here is an answer."]}))
    env = {**os.environ, "HARNESSRL_ADMIN_KEY": "pg-admin"}
    command = [sys.executable, "-m", "harnessrl.gateway", "--model", f"scripted:{script}", "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--store", pg_url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if match := re.search(r"listening on (http://\S+)", line):
                url = match.group(1)
                break
        else:
            raise AssertionError(f"gateway exited with {proc.wait()}")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining the log
        admin = GatewayClient(url, "pg-admin")
        admin.wait_ready(timeout=60)
        rollouts = [admin.create_rollout({"i": i}) for i in range(4)]

        def harness(rollout: dict[str, Any]) -> list[int]:
            seqs, messages = [], [{"role": "user", "content": "go"}]
            with httpx.Client(headers={"Authorization": f"Bearer {rollout['api_key']}"}, timeout=60) as http:
                for _ in range(5):
                    r = http.post(
                        f"{rollout['base_url']}/chat/completions", json={"model": "m", "messages": messages}
                    )
                    r.raise_for_status()
                    seqs.append(int(r.headers["x-harnessrl-call-seq"]))
                    messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
            return seqs

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(harness, rollouts)) == [list(range(5))] * 4
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    with PostgresStore(pg_url) as store:
        for rollout in rollouts:
            calls = store.list_calls(rollout["rollout_id"])
            assert [c.seq for c in calls] == list(range(5))
            for prev, nxt in itertools.pairwise(calls):  # each call extends the previous one token for token
                head = prev.prompt_token_ids + prev.response_token_ids
                assert nxt.prompt_token_ids[: len(head)] == head
            assert store.get_rollout(rollout["rollout_id"]).status == "running"
