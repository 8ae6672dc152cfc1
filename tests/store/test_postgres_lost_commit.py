"""A PostgreSQL connection that breaks around a COMMIT: the store must tell a call the server
recorded from one it did not, never answer an error for a recorded call (the gateway would then tell
the harness its call failed, and the trainer would train on an answer no harness received), and
must not leave the rollouts of a claim the server committed running with nothing running them.

The break is made by a real TCP proxy on 127.0.0.1 between the store and the server, which lets one
COMMIT through and cuts the client off when the server's reply comes (the server committed, the
client never hears it), or cuts it off instead of passing the COMMIT on (nothing was committed), or
swallows the COMMIT and keeps both connections open: a writer stalled in its transaction (a frozen
process, a host cut off), whose rollout's lock no other writer must wait on for ever.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import pytest

from harnessrl.errors import UpstreamError
from harnessrl.schemas import Call, Outcome, RolloutStatus, ToolRequest
from harnessrl.store.pg_server import PostgresServer

if os.environ.get("CI") != "true":  # CI must have the driver: there a missing one fails collection
    pytest.importorskip("psycopg", reason="needs harnessrl[postgres]")
from harnessrl.store.postgres import PostgresStore  # noqa: E402  (needs psycopg)

#: The simple-query message psycopg sends to commit (``Q``, its length, the text), and the tag of
#: the server's CommandComplete reply to it.
COMMIT_QUERY = b"Q\x00\x00\x00\x0bCOMMIT\x00"
COMMIT_DONE = b"COMMIT\x00"


class CommitCutter:
    """A TCP proxy on 127.0.0.1 to a server. ``arm(mode)`` acts on the next COMMIT: ``"committed"``
    lets it reach the server and cuts the client off once the server answered it; ``"lost"`` cuts
    the client off instead of passing it on; ``"stalled"`` swallows it and keeps both connections
    open. ``cut`` is set when it happened."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._mode: str | None = None  # None: pass everything
        self._lock = threading.Lock()
        self.cut = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, mode: str) -> None:
        assert mode in ("committed", "lost", "stalled")
        with self._lock:
            self._mode, self.cut = mode, threading.Event()

    def close(self) -> None:
        self._listener.close()
        for sock in self._sockets:
            _close(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            waiting = threading.Event()  # this connection's COMMIT went through; its reply is the cut
            threading.Thread(target=self._upstream, args=(client, server, waiting), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, waiting), daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket, waiting: threading.Event) -> None:
        while data := _recv(client):
            if COMMIT_QUERY in data:
                with self._lock:
                    mode, cut = self._mode, self.cut
                    self._mode = None
                if mode == "lost":  # the server never sees the COMMIT: it rolls back
                    cut.set()  # before the client can see the break
                    _close(client)
                    _close(server)
                    return
                if mode == "stalled":  # nor does it, but its session stays open, idle in its transaction
                    cut.set()
                    continue
                if mode == "committed":
                    waiting.set()
            if not _send(server, data):
                break
        _close(server)  # the client left (or was cut off): so does its server connection

    def _downstream(self, server: socket.socket, client: socket.socket, waiting: threading.Event) -> None:
        while data := _recv(server):
            if waiting.is_set() and COMMIT_DONE in data:  # committed: the client never hears it
                self.cut.set()  # before the client can see the break
                _close(client)
                _close(server)
                return
            if not _send(client, data):
                break
        _close(client)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
    except OSError:  # the other side is gone
        return False
    return True


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.fixture
def cutter_urls(pg_server: PostgresServer) -> Iterator[tuple[str, str, CommitCutter]]:
    """A fresh database's URL through a ``CommitCutter``, its direct URL, and the cutter."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    direct = pg_server.create_database(name)
    url = urlsplit(direct)
    assert url.hostname is not None and url.port is not None
    cutter = CommitCutter(url.hostname, url.port)
    userinfo, at, _ = url.netloc.rpartition("@")  # the user (and password) as the URL gives them
    through = urlunsplit(url._replace(netloc=f"{userinfo}{at}127.0.0.1:{cutter.port}"))
    yield through, direct, cutter
    cutter.close()
    pg_server.drop_database(name)


@pytest.fixture
def cut_store(cutter_urls: tuple[str, str, CommitCutter]) -> Iterator[tuple[PostgresStore, CommitCutter]]:
    through, _, cutter = cutter_urls
    store = PostgresStore(through, timeout_s=10)
    yield store, cutter
    store.close()


def a_call(rollout_id: str, n: int) -> Call:
    return Call(
        rollout_id=rollout_id, prompt_token_ids=[n, n], response_token_ids=[n + 1], response_logprobs=[-1.0]
    )


def test_a_call_the_server_committed_is_returned_although_the_answer_to_commit_was_lost(
    cut_store: tuple[PostgresStore, CommitCutter],
) -> None:
    store, cutter = cut_store
    rollout = store.create_rollout()
    store.add_call(a_call(rollout.rollout_id, 0))
    cutter.arm("committed")
    stored = store.add_call(a_call(rollout.rollout_id, 1))
    assert cutter.cut.is_set()  # the break happened, after the server committed
    assert stored.seq == 1
    assert store.list_calls(rollout.rollout_id)[1] == stored
    assert store.add_call(a_call(rollout.rollout_id, 2)).seq == 2  # and the rollout goes on


def test_a_batch_the_server_committed_is_returned_although_the_answer_to_commit_was_lost(
    cut_store: tuple[PostgresStore, CommitCutter],
) -> None:
    store, cutter = cut_store
    first, second = store.create_rollout(), store.create_rollout()
    cutter.arm("committed")
    calls = [a_call(first.rollout_id, 0), a_call(second.rollout_id, 0), a_call(first.rollout_id, 1)]
    results = store.add_calls(calls)
    assert cutter.cut.is_set()
    assert all(isinstance(r, Call) for r in results)
    assert [r.seq for r in results if isinstance(r, Call)] == [0, 0, 1]
    assert store.list_calls(first.rollout_id) == [results[0], results[2]]
    assert store.list_calls(second.rollout_id) == [results[1]]


def test_a_call_whose_commit_never_reached_the_server_is_an_upstream_error(
    cut_store: tuple[PostgresStore, CommitCutter],
) -> None:
    store, cutter = cut_store
    rollout = store.create_rollout()
    cutter.arm("lost")
    with pytest.raises(UpstreamError):
        store.add_call(a_call(rollout.rollout_id, 0))
    assert cutter.cut.is_set()
    assert store.list_calls(rollout.rollout_id) == []  # nothing recorded, and the error said so
    cutter.arm("lost")
    with pytest.raises(UpstreamError):
        store.add_calls([a_call(rollout.rollout_id, 0), a_call(rollout.rollout_id, 1)])
    assert store.list_calls(rollout.rollout_id) == []
    assert store.add_call(a_call(rollout.rollout_id, 0)).seq == 0


def a_search(rollout_id: str, query: str) -> ToolRequest:
    return ToolRequest(rollout_id=rollout_id, tool="search", request={"query": query}, response={"hits": []})


def test_a_search_the_server_committed_is_no_error_although_the_answer_to_commit_was_lost(
    cut_store: tuple[PostgresStore, CommitCutter],
) -> None:
    """A search stored although its COMMIT's answer was lost must not raise: the search tool would
    answer the harness an error for it, and count it against ``max_searches_per_rollout`` beside
    the retry the harness makes."""
    store, cutter = cut_store
    rollout = store.start_rollout(store.create_rollout().rollout_id)
    cutter.arm("committed")
    store.add_tool_request(a_search(rollout.rollout_id, "first"))
    assert cutter.cut.is_set()
    store.add_tool_request(a_search(rollout.rollout_id, "second"))
    stored = store.list_tool_requests(rollout.rollout_id)
    assert [r.request["query"] for r in stored] == ["first", "second"]


def test_a_search_whose_commit_never_reached_the_server_is_an_upstream_error(
    cut_store: tuple[PostgresStore, CommitCutter],
) -> None:
    store, cutter = cut_store
    rollout = store.start_rollout(store.create_rollout().rollout_id)
    cutter.arm("lost")
    with pytest.raises(UpstreamError):
        store.add_tool_request(a_search(rollout.rollout_id, "lost"))
    assert cutter.cut.is_set()
    assert store.list_tool_requests(rollout.rollout_id) == []


def test_rollouts_a_lost_claim_took_are_handed_out_by_the_next_claim(
    cut_store: tuple[PostgresStore, CommitCutter],
) -> None:
    """A claim the server committed but whose answer was lost is an ``UpstreamError`` (the controller
    claims again at its next poll); its rollouts must not stay running with nothing running them."""
    store, cutter = cut_store
    made = [store.create_rollout().rollout_id for _ in range(5)]
    cutter.arm("committed")
    with pytest.raises(UpstreamError):
        store.claim_rollouts("w1", 2)
    assert cutter.cut.is_set()
    assert [store.get_rollout(rid).worker_id for rid in made[:2]] == ["w1", "w1"]  # committed
    assert [r.rollout_id for r in store.claim_rollouts("w2", 2)] == made[2:4]  # never another's
    assert [r.rollout_id for r in store.claim_rollouts("w1", 1)] == made[:1]  # up to the limit
    assert [r.rollout_id for r in store.claim_rollouts("w1", 3)] == [made[1], made[4]]  # the rest
    assert store.claim_rollouts("w1", 3) == []


def test_a_writer_stalled_in_its_transaction_holds_its_rollout_only_for_timeout_s(
    cutter_urls: tuple[str, str, CommitCutter],
) -> None:
    """A gateway whose COMMIT never reaches the server (a host cut off, a frozen process) sits in
    its transaction holding the rollout's row lock: the server must end that transaction after the
    store's ``timeout_s``, or the controller's finish of that rollout waits for ever; and the stalled
    writer gets an ``UpstreamError``, its call not recorded."""
    through, direct, cutter = cutter_urls
    with PostgresStore(through, timeout_s=1) as gateway, PostgresStore(direct) as controller:
        rollout = controller.start_rollout(controller.create_rollout().rollout_id)
        cutter.arm("stalled")
        pool = ThreadPoolExecutor(2)
        try:
            stalled = pool.submit(gateway.add_call, a_call(rollout.rollout_id, 0))
            assert cutter.cut.wait(30)  # the call holds the rollout's lock, its COMMIT swallowed
            finish = pool.submit(controller.finish_rollout, rollout.rollout_id, Outcome.SUCCESS, 1.0)
            assert finish.result(timeout=30).status is RolloutStatus.FINISHED
            with pytest.raises(UpstreamError):
                stalled.result(timeout=30)
        finally:
            cutter.close()  # where the server never ends it, what unblocks the stalled call at last
            pool.shutdown()
        assert controller.list_calls(rollout.rollout_id) == []
