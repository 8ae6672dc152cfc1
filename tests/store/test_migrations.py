"""Schema versions and in-place migrations, on every backend whose data outlives a connection.

A version-1 store (the frozen first schema in ``migrations.MIGRATIONS``) is built and filled with
raw SQL, as the first release wrote it; opening it with the current code must migrate it in place
with every record intact. A store newer than the code is refused and left untouched.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sqlite3
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.store.calls import agent_trace, make_call

from harnessrl.errors import HarnessRLError
from harnessrl.schemas import Call, Outcome, PolicyVersion, Rollout, RolloutStatus, Run, Task, Usage
from harnessrl.store import migrations
from harnessrl.store.base import RolloutEnded
from harnessrl.store.codecs import dump_json, pack_floats, pack_ints, rollout_to_row
from harnessrl.store.migrations import SCHEMA_VERSION, migrate_postgres, migrate_sqlite, pending, statements

WORKER = Path(__file__).with_name("store_worker.py")


@contextlib.contextmanager
def raw_connection(url: str) -> Iterator[tuple[Any, str]]:
    """A plain DB-API connection to the factory's database and its placeholder style; commits on exit."""
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url) as conn:  # commits when the block ends without error
            yield conn, "%s"
    else:
        path = Path(url.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn, "?"
            conn.execute("COMMIT")
        finally:
            conn.close()


def whole_call_row(call: Call) -> dict[str, Any]:
    """A call's row as versions 1-3 stored it (frozen here): the whole prompt, the whole request."""
    row = call.model_dump(exclude={"prompt_token_ids", "response_token_ids", "response_logprobs"})
    row.update(
        request=dump_json(call.request),
        response=dump_json(call.response),
        usage=None if call.usage is None else dump_json(row["usage"]),
        prompt_token_ids=pack_ints(call.prompt_token_ids),
        response_token_ids=pack_ints(call.response_token_ids),
        response_logprobs=pack_floats(call.response_logprobs),
    )
    return row


def migrate_raw(conn: Any, mark: str, target: int) -> int:
    return (migrate_postgres if mark == "%s" else migrate_sqlite)(conn, target=target)


def insert(conn: Any, mark: str, table: str, row: dict[str, Any]) -> None:
    columns = ", ".join(row)
    conn.execute(
        f"INSERT INTO {table} ({columns}) VALUES ({', '.join([mark] * len(row))})", list(row.values())
    )


def stored_version(url: str) -> int:
    with raw_connection(url) as (conn, _):
        return int(conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])


def test_v1_store_is_migrated_in_place_with_data_intact(shared_store_factory: Any) -> None:
    url = shared_store_factory.url
    run = Run(run_id="run-1", config={"lr": 1e-6})
    task = Task(task_id="t1", run_id="run-1", data={"prompt": "2+2"})
    done = Rollout(
        rollout_id="r-done", api_key="hrl-done", run_id="run-1", task_id="t1", group_id="g", step=0,
        status=RolloutStatus.FINISHED, outcome=Outcome.SUCCESS, reward=1.0, attempt=1,
        flags=["git_log"], metadata={"evaluator": {"passed": 3}}, started_at=1.0, finished_at=2.0,
    )  # fmt: skip
    queued = Rollout(rollout_id="r-queued", api_key="hrl-queued", task={"prompt": "hi"})
    calls = [
        Call(
            rollout_id="r-done", seq=seq, attempt=seq // 2, call_id=f"c{seq}",
            request={"messages": [{"role": "user", "content": f"q{seq} ☃"}]}, response={"content": "a"},
            prompt_token_ids=[seq, 2**31 - 1, 0], response_token_ids=[7], response_logprobs=[-0.0 - seq / 3],
            usage=Usage(prompt_tokens=3, completion_tokens=1), policy_version=seq,
        )
        for seq in range(3)
    ]  # fmt: skip
    with raw_connection(url) as (conn, mark):
        assert migrate_raw(conn, mark, target=1) == 0
        insert(conn, mark, "runs", {**run.model_dump(), "config": dump_json(run.config)})
        insert(conn, mark, "tasks", {**task.model_dump(), "data": dump_json(task.data)})
        insert(conn, mark, "rollouts", rollout_to_row(done))
        insert(conn, mark, "rollouts", rollout_to_row(queued))
        for call in calls:
            insert(conn, mark, "calls", whole_call_row(call))
        version = PolicyVersion(version=3, step=2, checkpoint="/ckpt/3", metadata={"loss": 0.5})
        insert(
            conn, mark, "policy_versions", {**version.model_dump(), "metadata": dump_json(version.metadata)}
        )
    assert stored_version(url) == 1
    assert index_columns(url, "rollouts_run") == ["run_id", "status"]

    store = shared_store_factory()  # the current code: migrates on open
    assert stored_version(url) == SCHEMA_VERSION
    assert store.list_runs() == [run] and store.list_tasks() == [task]
    assert store.get_rollout("r-done") == done and store.get_rollout_by_key("hrl-queued") == queued
    assert store.list_calls("r-done") == calls
    assert store.list_policy_versions() == [version]
    assert index_columns(url, "rollouts_run") == ["run_id", "status", "pk"]  # version 2's change
    with pytest.raises(RolloutEnded):  # a finished rollout takes no more calls, migrated or not
        store.add_call(calls[0].model_copy(update={"call_id": None}))
    assert store.add_call(calls[0].model_copy(update={"rollout_id": "r-queued", "call_id": None})).seq == 0
    assert [r.rollout_id for r in store.claim_rollouts("w", 5)] == ["r-queued"]
    store.close()
    assert shared_store_factory().count_calls() == 4  # reopening an up-to-date store changes nothing
    assert stored_version(url) == SCHEMA_VERSION


def index_columns(url: str, index: str) -> list[str]:
    with raw_connection(url) as (conn, mark):
        if mark == "?":
            return [row[2] for row in conn.execute(f"PRAGMA index_info({index})")]
        sql = (
            "SELECT a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE c.relname = %s ORDER BY array_position(i.indkey::int2[], a.attnum)"
        )
        return [row[0] for row in conn.execute(sql, (index,))]


def test_newer_store_is_refused_and_left_alone(shared_store_factory: Any) -> None:
    url = shared_store_factory.url
    shared_store_factory().create_rollout(rollout_id="kept")
    with raw_connection(url) as (conn, mark):
        conn.execute(
            f"UPDATE meta SET value = {mark} WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
        )
    with pytest.raises(
        HarnessRLError, match=rf"schema version {SCHEMA_VERSION + 1}, newer .*upgrade harnessrl"
    ):
        shared_store_factory()
    assert stored_version(url) == SCHEMA_VERSION + 1
    with raw_connection(url) as (conn, _):
        assert conn.execute("SELECT rollout_id FROM rollouts").fetchall() == [("kept",)]


def test_migrating_part_way_then_the_rest(shared_store_factory: Any) -> None:
    url = shared_store_factory.url
    with raw_connection(url) as (conn, mark):
        assert migrate_raw(conn, mark, target=1) == 0
        assert migrate_raw(conn, mark, target=1) == 1  # already there: nothing to do
    with raw_connection(url) as (conn, mark):
        assert migrate_raw(conn, mark, target=SCHEMA_VERSION) == 1
    assert stored_version(url) == SCHEMA_VERSION


def test_migration_list_is_well_formed() -> None:
    assert [m.version for m in migrations.MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))
    assert pending(0) == migrations.MIGRATIONS
    assert pending(SCHEMA_VERSION) == ()
    assert pending(0, target=1) == migrations.MIGRATIONS[:1]
    with pytest.raises(HarnessRLError, match="newer"):
        pending(SCHEMA_VERSION + 1)
    with pytest.raises(ValueError, match="target"):
        pending(0, target=SCHEMA_VERSION + 1)
    for migration in migrations.MIGRATIONS:
        assert statements(migration.sqlite) or migration.repair, f"migration {migration.version} does nothing"
        if migration.version in REBUILT_IN_SQLITE:
            continue  # test_both_dialects_end_with_the_same_columns compares what they made
        assert len(statements(migration.sqlite)) == len(statements(migration.postgres)), (
            f"migration {migration.version} differs between dialects"
        )


#: Migrations whose SQLite dialect rebuilds a table (a change SQLite cannot make in place), in more
#: statements than PostgreSQL's ALTER.
REBUILT_IN_SQLITE = {8: "calls.prompt_len loses its default"}


def table_columns(url: str) -> dict[str, list[tuple[str, bool, bool]]]:
    """Each table's columns in order: (name, NOT NULL, has a default)."""
    with raw_connection(url) as (conn, mark):
        if mark == "?":
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {
                t: [
                    (r[1], bool(r[3]) or bool(r[5]), r[4] is not None)
                    for r in conn.execute(f"PRAGMA table_info({t})")
                ]
                for t in tables
            }
        rows = conn.execute(
            "SELECT table_name, column_name, is_nullable = 'NO', "
            "column_default IS NOT NULL OR is_identity = 'YES' FROM information_schema.columns "
            "WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"
        ).fetchall()
    found: dict[str, list[tuple[str, bool, bool]]] = {}
    for table, column, not_null, default in rows:
        found.setdefault(table, []).append((column, not_null, default))
    return found


def test_both_dialects_end_with_the_same_columns(pg_server: Any, tmp_path: Path) -> None:
    """The SQLite and PostgreSQL migrations make the same tables: the same columns in the same order,
    each as nullable and with a default in both. ``calls.prompt_len`` has none (migration 8): an
    insert that leaves it out (a version 1-3 writer's) is refused on both."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    url = pg_server.create_database(name)
    try:
        for where in (f"sqlite:///{tmp_path / 'store.db'}", url):
            with raw_connection(where) as (conn, mark):
                migrate_raw(conn, mark, target=SCHEMA_VERSION)
        sqlite_columns, pg_columns = table_columns(f"sqlite:///{tmp_path / 'store.db'}"), table_columns(url)
    finally:
        pg_server.drop_database(name)
    # ``pk``, an INTEGER PRIMARY KEY, is SQLite's rowid: filled in when left out, as the identity is.
    for columns in sqlite_columns.values():
        columns[:] = [(name, not_null, default or name == "pk") for name, not_null, default in columns]
    assert sqlite_columns == pg_columns
    assert ("prompt_len", True, False) in sqlite_columns["calls"]


def test_the_store_docs_name_the_current_version_and_every_migration() -> None:
    """docs/store.md said version 5 when the code was at 7, with no row for 6 or 7."""
    doc = (Path(__file__).parents[2] / "docs" / "store.md").read_text()
    assert f"`harnessrl.store.migrations.SCHEMA_VERSION` ({SCHEMA_VERSION})" in doc
    table = doc.split("## Schema versions and migrations", 1)[1].split("\n\n")[2]
    assert [int(v) for v in re.findall(r"^\| (\d+) \|", table, re.M)] == list(range(1, SCHEMA_VERSION + 1))


def test_statements_drop_comments() -> None:
    script = "CREATE TABLE a (x INT); -- a comment; with a semicolon\nCREATE INDEX i ON a (x) -- trailing\n;"
    assert statements(script) == ["CREATE TABLE a (x INT)", "CREATE INDEX i ON a (x)"]


def test_processes_opening_a_fresh_store_at_once(shared_store_factory: Any) -> None:
    """Only one of several processes opening an empty database migrates it; none fails."""
    url = shared_store_factory.url
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "claim", url, f"p{i}"], stdin=subprocess.PIPE, text=True
        )
        for i in range(3)
    ]
    for proc in procs:
        proc.communicate("go\n", timeout=60)
        assert proc.returncode == 0
    assert stored_version(url) == SCHEMA_VERSION
    assert shared_store_factory().count_rollouts() == 0


def test_rows_stored_before_the_strict_boundary_are_repaired_once(shared_store_factory: Any) -> None:
    """Migration 3: lone surrogates and NaN/Infinity inside stored JSON, and a non-finite reward,
    as a store at version 2 may hold them (written by the lenient parser), are rewritten in place;
    clean rows are left byte for byte as they were."""
    url = shared_store_factory.url
    poisoned = Rollout(
        rollout_id="r-bad", api_key="hrl-bad", task={"prompt": "a\ud800b", "\udc00": [1.5]},
        metadata={"m": "\ud83d", "pair": "😀"}, status=RolloutStatus.FINISHED,
        outcome=Outcome.SUCCESS, flags=["git_log"],
    )  # fmt: skip
    clean = Rollout(rollout_id="r-ok", api_key="hrl-ok", task={"prompt": "NaN is fine in text ☃"}, reward=0.5)
    bad_call = Call(
        rollout_id="r-bad", seq=0, call_id="c0",
        request={"model": "m\ud800", "metadata": {"s": math.nan, "t": [math.inf]}},
        response={"content": "ok"}, prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[-0.5],
    )  # fmt: skip
    with raw_connection(url) as (conn, mark):
        assert migrate_raw(conn, mark, target=2) == 0
        row = rollout_to_row(poisoned)
        row["reward"] = math.inf
        insert(conn, mark, "rollouts", row)
        insert(conn, mark, "rollouts", rollout_to_row(clean))
        insert(conn, mark, "calls", whole_call_row(bad_call))
        before_clean = conn.execute(
            f"SELECT task FROM rollouts WHERE rollout_id = {mark}", ("r-ok",)
        ).fetchone()[0]

    store = shared_store_factory()  # migrates to 3 on open
    assert stored_version(url) == SCHEMA_VERSION
    fixed = store.get_rollout("r-bad")
    assert fixed.task == {"prompt": "a\ufffdb", "\ufffd": [1.5]}
    assert fixed.metadata == {"m": "\ufffd", "pair": "😀"}  # stored as a valid surrogate pair: kept
    assert fixed.reward is None and fixed.flags == ["git_log", migrations.REWARD_REPAIRED_FLAG]
    [call] = store.list_calls("r-bad")
    assert call.request == {"model": "m\ufffd", "metadata": {"s": None, "t": [None]}}
    assert store.get_rollout("r-ok") == clean
    store.close()
    with raw_connection(url) as (conn, mark):
        after_clean = conn.execute(
            f"SELECT task FROM rollouts WHERE rollout_id = {mark}", ("r-ok",)
        ).fetchone()[0]
        stored = conn.execute(f"SELECT request FROM calls WHERE call_id = {mark}", ("c0",)).fetchone()[0]
    assert after_clean == before_clean
    json.loads(stored, parse_constant=lambda name: pytest.fail(f"{name} left in the store"))


def test_whole_calls_are_rewritten_as_deltas_in_place(shared_store_factory: Any) -> None:
    """Migration 4: calls stored whole (versions 1-3) become deltas on their chain and read back
    equal: two attempts of a growing conversation, a call with an edited history, a completions
    call, another rollout. New calls then extend the migrated chains."""
    url = shared_store_factory.url
    first = agent_trace("r-long", 8, system=300, observation=40, answer=10)
    retried = [
        c.model_copy(update={"attempt": 1})
        for c in agent_trace("r-long", 4, system=300, observation=40, answer=10)
    ]
    edited = retried[-1].model_copy(
        update={"request": {**retried[-1].request, "messages": retried[-1].request["messages"][1:]}}
    )
    completion = make_call("r-long", api="completions", attempt=1, request={"model": "m", "prompt": "2+2="})
    calls = [
        call.model_copy(update={"seq": seq, "call_id": f"c{seq}"})
        for seq, call in enumerate([*first, *retried, edited, completion])
    ]
    other = make_call(
        "r-other", seq=0, call_id="o0", request={"messages": [{"role": "user", "content": "hi"}]}
    )
    with raw_connection(url) as (conn, mark):
        assert migrate_raw(conn, mark, target=3) == 0
        for rollout_id in ("r-long", "r-other"):
            insert(
                conn,
                mark,
                "rollouts",
                rollout_to_row(Rollout(rollout_id=rollout_id, api_key=f"hrl-{rollout_id}")),
            )
        for call in [*calls, other]:
            insert(conn, mark, "calls", whole_call_row(call))
    before = column_bytes(url, ("prompt_token_ids", "request"))

    store = shared_store_factory()  # migrates to 4 on open
    assert stored_version(url) == SCHEMA_VERSION
    assert store.list_calls("r-long") == calls and store.list_calls("r-other") == [other]
    assert store.list_calls("r-long", attempt=1) == calls[8:]
    assert column_bytes(url, ("prompt_token_ids", "request", "request_items")) < before / 3
    with raw_connection(url) as (conn, _):
        rows = conn.execute(
            "SELECT seq, prompt_base_seq, prompt_len FROM calls WHERE rollout_id = 'r-long' ORDER BY seq"
        )
        bases = [(seq, base) for seq, base, _ in rows.fetchall()]
    # Each attempt's calls extend its own chain; the edited and the completions call do not.
    assert bases == [
        (0, None),
        *((s, s - 1) for s in range(1, 8)),
        (8, None),
        (9, 8),
        (10, 9),
        (11, 10),
        (12, 10),
        (13, None),
    ]
    nxt = first[-1].model_copy(
        update={
            "attempt": 1,
            "prompt_token_ids": [*retried[-1].prompt_token_ids, *retried[-1].response_token_ids, 5],
        }
    )
    added = store.add_call(nxt)
    assert store.list_calls("r-long")[-1] == added
    with raw_connection(url) as (conn, mark):
        row = conn.execute(
            f"SELECT prompt_base_seq, prompt_len FROM calls WHERE call_id = {mark}", (added.call_id,)
        ).fetchone()
    assert tuple(row) == (
        12,
        len(nxt.prompt_token_ids),
    )  # call 12 repeats call 11's tokens: the newest chain wins


def column_bytes(url: str, columns: tuple[str, ...]) -> int:
    """What the calls table holds in these columns, in bytes (their text is ASCII)."""
    total = " + ".join(f"COALESCE(LENGTH({c}), 0)" for c in columns)
    with raw_connection(url) as (conn, _):
        return int(conn.execute(f"SELECT SUM({total}) FROM calls").fetchone()[0])


def _chained_rollout(url: str, rollout_id: str, calls: list[Call], *, target: int) -> None:
    """``calls`` of a new rollout as a store at version ``target`` holds them: stored whole at version
    3, as those versions wrote them, then migrated (migration 4 chains them)."""
    with raw_connection(url) as (conn, mark):
        migrate_raw(conn, mark, target=3)
        insert(
            conn,
            mark,
            "rollouts",
            rollout_to_row(Rollout(rollout_id=rollout_id, api_key=f"hrl-{rollout_id}")),
        )
        for call in calls:
            insert(conn, mark, "calls", whole_call_row(call))
    with raw_connection(url) as (conn, mark):
        migrate_raw(conn, mark, target=target)


def _numbered(calls: list[Call], start: int = 0) -> list[Call]:
    return [
        c.model_copy(update={"seq": s, "call_id": f"{c.rollout_id}-{s}"}) for s, c in enumerate(calls, start)
    ]


def test_an_old_writers_call_is_refused_and_never_poisons_the_rollout(shared_store_factory: Any) -> None:
    """A gateway of an older harnessrl (schema 1-3) still running while a newer process migrated the
    store wrote its calls with the old column list: ``prompt_len`` took its default 0, and from then
    on ``list_calls`` and every later ``add_call`` of that rollout raised "the store is damaged".
    Such a write now fails in the old process (``prompt_len`` has no default), and the rollout reads
    and records on."""
    url = shared_store_factory.url
    trace = _numbered(agent_trace("r", 4, system=30, observation=5, answer=3))
    store = shared_store_factory()
    store.create_rollout(rollout_id="r")
    for call in trace[:2]:
        store.add_call(call.model_copy(update={"seq": -1}))
    # What the old gateway's add_call inserted: refused (sqlite3's IntegrityError, psycopg's
    # NotNullViolation), so that gateway's call fails and its harness is told.
    with pytest.raises(Exception, match="prompt_len") as refused, raw_connection(url) as (conn, mark):
        insert(conn, mark, "calls", whole_call_row(trace[2]))
    assert "NOT NULL" in str(refused.value).upper() or "not-null" in str(refused.value)
    assert store.list_calls("r") == trace[:2]
    added = store.add_call(trace[2].model_copy(update={"seq": -1, "call_id": None}))
    assert added.seq == 2 and store.list_calls("r")[2] == added


def test_an_old_writers_rows_in_a_migrated_store_are_repaired(shared_store_factory: Any) -> None:
    """A store at the previous version (7) holding calls an old gateway wrote after migration 4 (the
    version 1-3 column list, ``prompt_len`` left 0): opening it migrates it and repairs those rows,
    so the rollout reads back whole and takes further calls; an old-shaped write is refused from
    then on."""
    url = shared_store_factory.url
    trace = _numbered(agent_trace("r", 5, system=30, observation=5, answer=3))
    other = _numbered(agent_trace("o", 2, system=20, observation=5, answer=3))
    _chained_rollout(url, "r", trace[:2], target=7)
    _chained_rollout(url, "o", other, target=7)
    with raw_connection(url) as (conn, mark):  # the old gateway's calls, accepted by schema 7
        for call in trace[2:4]:
            insert(conn, mark, "calls", whole_call_row(call))
    assert stored_version(url) == 7  # the schema before the chained rows were repaired

    store = shared_store_factory()  # migrates to the current version on open
    assert stored_version(url) == SCHEMA_VERSION
    assert store.list_calls("r") == trace[:4] and store.list_calls("o") == other
    added = store.add_call(trace[4].model_copy(update={"seq": -1, "call_id": None}))
    assert added.seq == 4 and store.list_calls("r") == [*trace[:4], added]
    with raw_connection(url) as (conn, mark):
        lengths = conn.execute(
            f"SELECT prompt_len FROM calls WHERE rollout_id = {mark} ORDER BY seq", ("r",)
        ).fetchall()
    assert [row[0] for row in lengths] == [len(c.prompt_token_ids) for c in [*trace[:4], added]]
    with pytest.raises(Exception, match="prompt_len"), raw_connection(url) as (conn, mark):
        insert(conn, mark, "calls", whole_call_row(trace[4].model_copy(update={"call_id": "late"})))
    store.close()
    assert shared_store_factory().list_calls("r") == [*trace[:4], added]  # reopening changes nothing


def test_a_row_in_the_old_shape_reads_whole_and_damage_names_its_call(shared_store_factory: Any) -> None:
    """Should a whole call as versions 1-3 wrote it be present anyway (its chain columns NULL,
    ``prompt_len`` 0), it reads whole, as migration 4 reads such rows, and the rollout takes further
    calls: before, that one row made every read and write of the rollout raise. A row damaged
    otherwise still raises, naming the call."""
    url = shared_store_factory.url
    trace = _numbered(agent_trace("r", 4, system=30, observation=5, answer=3))
    store = shared_store_factory()
    store.create_rollout(rollout_id="r")
    for call in trace[:2]:
        store.add_call(call.model_copy(update={"seq": -1}))
    with raw_connection(url) as (conn, mark):
        insert(conn, mark, "calls", {**whole_call_row(trace[2]), "prompt_len": 0})
    assert store.list_calls("r") == trace[:3]
    added = store.add_call(trace[3].model_copy(update={"seq": -1, "call_id": None}))
    assert added.seq == 3 and store.list_calls("r") == [*trace[:3], added]

    with raw_connection(url) as (conn, mark):  # the control: a chained row whose length is wrong
        conn.execute(f"UPDATE calls SET prompt_len = 0 WHERE call_id = {mark}", (added.call_id,))
    with pytest.raises(HarnessRLError, match="call r/3: its prompt has .* the store is damaged"):
        store.list_calls("r")


def test_repairing_a_big_store_holds_a_batch_of_suspect_rows_not_all_of_them(
    shared_store_factory: Any,
) -> None:
    """Migration 3 read every row whose JSON might need repair at once: every call holding an emoji
    (its escaped surrogate pair matches) of a big store, its whole request each (versions 1-3 stored
    it whole), at once in memory. It reads them a batch at a time."""
    url = shared_store_factory.url
    text = "😀" + "x" * 20_000
    calls = [
        Call(
            rollout_id=f"r{i}",
            seq=0,
            call_id=f"c{i:04d}",
            request={"content": text},
            response={},
            prompt_token_ids=[1],
            response_token_ids=[2],
            response_logprobs=[-0.5],
        )
        for i in range(400)
    ]
    with raw_connection(url) as (conn, mark):
        assert migrate_raw(conn, mark, target=2) == 0
        for call in calls:
            insert(
                conn,
                mark,
                "rollouts",
                rollout_to_row(Rollout(rollout_id=call.rollout_id, api_key=call.call_id)),
            )
            insert(conn, mark, "calls", whole_call_row(call))
    suspect = sum(len(dump_json(call.request)) for call in calls)  # about 8 MB
    with raw_connection(url) as (conn, mark):
        tracemalloc.start()
        try:
            migrate_raw(conn, mark, target=3)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        stored = conn.execute(f"SELECT request FROM calls WHERE call_id = {mark}", ("c0399",)).fetchone()[0]
    assert json.loads(stored) == {"content": text}  # a valid pair: left as it was
    assert peak < 0.4 * suspect
