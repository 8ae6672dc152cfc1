"""The retriever on the gateway, over HTTP: a rollout's own key only, every served search recorded
with what it returned, and what a hostile rollout sends (other rollouts' URLs, closed rollouts, huge
queries and bodies, floods) refused in the provider's error shape, never a 500 or a dead gateway."""

from __future__ import annotations

import json
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from .conftest import ADMIN_KEY, PASSAGES


def post(url: str, key: str | None, body: object) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url, json=body, headers=headers, timeout=30)


def test_a_search_answers_the_best_passages_and_is_recorded(make_search_gateway) -> None:
    gw = make_search_gateway()
    rollout = gw.rollout()
    answer = post(gw.search_url(rollout), rollout["api_key"], {"query": "who founded Velmora", "top_k": 2})
    assert answer.status_code == 200
    passages = answer.json()["passages"]
    assert passages[0]["id"] == "velmora" and passages[0]["text"] == PASSAGES[0]["text"]
    assert len(passages) <= 2
    [logged] = gw.store.list_tool_requests(rollout["rollout_id"])
    assert logged.tool == "search" and logged.attempt == 0
    assert logged.request == {"query": "who founded Velmora", "top_k": 2}
    assert logged.response["passages"] == passages
    # The admin reads the log over the control API; a rollout key cannot.
    listed = httpx.get(
        f"{gw.url}/api/rollouts/{rollout['rollout_id']}/tool_requests",
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert listed.status_code == 200 and listed.json()[0]["response"]["passages"] == passages
    refused = httpx.get(
        f"{gw.url}/api/rollouts/{rollout['rollout_id']}/tool_requests",
        headers={"authorization": f"Bearer {rollout['api_key']}"},
    )
    assert refused.status_code == 401


def test_only_the_rollouts_own_key_searches_under_its_url(make_search_gateway) -> None:
    gw = make_search_gateway()
    mine, other = gw.rollout(), gw.rollout()
    url = gw.search_url(mine)
    body = {"query": "Velmora"}
    assert post(url, None, body).status_code == 401
    assert post(url, "hrl-not-a-key", body).status_code == 401
    assert post(url, ADMIN_KEY, body).status_code == 401  # the admin key is not a rollout key
    forbidden = post(url, other["api_key"], body)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
    assert gw.store.list_tool_requests(mine["rollout_id"]) == []
    assert gw.store.list_tool_requests(other["rollout_id"]) == []
    assert post(url, mine["api_key"], body).status_code == 200  # control


def test_a_rollout_that_ended_searches_no_more(make_search_gateway) -> None:
    gw = make_search_gateway()
    rollout = gw.rollout()
    assert post(gw.search_url(rollout), rollout["api_key"], {"query": "Velmora"}).status_code == 200
    gw.client.cancel_rollout(rollout["rollout_id"])
    closed = post(gw.search_url(rollout), rollout["api_key"], {"query": "Velmora"})
    assert closed.status_code == 409 and closed.json()["error"]["code"] == "rollout_closed"
    assert len(gw.store.list_tool_requests(rollout["rollout_id"])) == 1


def test_huge_queries_and_bodies_are_refused_before_any_work(make_search_gateway) -> None:
    gw = make_search_gateway(max_query_chars=100)
    rollout = gw.rollout()
    url, key = gw.search_url(rollout), rollout["api_key"]
    assert post(url, key, {"query": "Velmora " + "x" * 92}).status_code == 200  # control: 100 characters
    too_long = post(url, key, {"query": "Velmora " + "x" * 93})
    assert too_long.status_code == 413 and too_long.json()["error"]["code"] == "payload_too_large"
    huge_body = post(url, key, {"query": "Velmora", "pad": "x" * 5_000_000})
    assert huge_body.status_code == 413
    for bad, param in [({"query": ""}, "query"), ({"query": 7}, "query"), ({"query": "a", "top_k": 0}, "top_k"),
                       ({"query": "a", "top_k": 11}, "top_k"), ({"query": "a", "top_k": True}, "top_k")]:  # fmt: skip
        answer = post(url, key, bad)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, bad
    not_json = httpx.post(url, content=b"{query: 1", headers={"authorization": f"Bearer {key}"})
    assert not_json.status_code == 400
    assert len(gw.store.list_tool_requests(rollout["rollout_id"])) == 1  # only the control


def test_path_tricks_in_a_query_never_read_a_file_outside_the_corpus(
    make_search_gateway, tmp_path: Path
) -> None:
    # A secret beside the corpus, named by every trick: only corpus passages ever come back.
    token = f"SECRET{secrets.token_hex(8)}"
    secret = tmp_path / "secret.txt"
    secret.write_text(f"{token}\n")
    gw = make_search_gateway()
    rollout = gw.rollout()
    url, key = gw.search_url(rollout), rollout["api_key"]
    tricks = [
        str(secret), f"file://{secret}", f"../../{secret.name}", f"{gw.corpus.parent}/../secret.txt", token,
        "/etc/passwd", "../../../../etc/shadow", "root:x:0:0", "\x00/etc/passwd", "%2e%2e%2fsecret.txt",
    ]  # fmt: skip
    corpus_ids = {p["id"] for p in PASSAGES}
    for query in tricks:
        answer = post(url, key, {"query": query})
        assert answer.status_code in (200, 400), query
        if answer.status_code == 200:  # (the answer echoes the query: only the passages are read)
            passages = answer.json()["passages"]
            assert {p["id"] for p in passages} <= corpus_ids, query
            assert not any(token in p["text"] or "root:" in p["text"] for p in passages), query
    # Control: the same token in the corpus is found, so the queries above would have surfaced it.
    leaky = make_search_gateway([*PASSAGES, {"id": "s", "title": "secret", "text": token}])
    rollout = leaky.rollout()
    found = post(leaky.search_url(rollout), rollout["api_key"], {"query": token}).json()["passages"]
    assert [p["text"] for p in found] == [token]


def test_a_burst_past_the_rate_is_refused_with_retry_after_and_other_rollouts_are_untouched(
    make_search_gateway,
) -> None:
    gw = make_search_gateway(rate_per_s=0.001, burst=5)  # refills one search in ~17 min: none in a test
    greedy, quiet = gw.rollout(), gw.rollout()
    statuses = [post(gw.search_url(greedy), greedy["api_key"], {"query": "Velmora"}) for _ in range(8)]
    assert [s.status_code for s in statuses] == [200] * 5 + [429] * 3
    assert statuses[-1].json()["error"]["code"] == "overloaded" and "retry-after" in statuses[-1].headers
    assert post(gw.search_url(quiet), quiet["api_key"], {"query": "Velmora"}).status_code == 200  # control
    assert len(gw.store.list_tool_requests(greedy["rollout_id"])) == 5


def test_retry_after_is_the_buckets_own_wait_so_a_client_obeying_it_is_served(make_search_gateway) -> None:
    # Retry-After was always "1": with rate_per_s = 0.1 a client obeying it was refused ten times over.
    clock = [1000.0]  # the rate limit's clock, moved by the test (no sleeping)
    gw = make_search_gateway(rate_per_s=0.1, burst=1, clock=lambda: clock[0])
    rollout = gw.rollout()
    url, key = gw.search_url(rollout), rollout["api_key"]
    assert post(url, key, {"query": "Velmora"}).status_code == 200
    refused = post(url, key, {"query": "Velmora"})
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "overloaded"
    assert refused.headers["retry-after"] == "10"  # one search per 10 s, none saved up
    clock[0] += 9.5
    nearly = post(url, key, {"query": "Velmora"})
    assert nearly.status_code == 429 and nearly.headers["retry-after"] == "1"  # 0.5 s, rounded up
    clock[0] += float(nearly.headers["retry-after"])  # the client obeys the header
    assert post(url, key, {"query": "Velmora"}).status_code == 200
    metrics = httpx.get(f"{gw.url}/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}).text
    assert 'harnessrl_errors_total{code="overloaded"} 2.0' in metrics  # counted like any other error


def test_a_flood_from_one_rollout_is_rate_limited_never_a_crash(make_search_gateway) -> None:
    gw = make_search_gateway(rate_per_s=0.001, burst=20)
    rollout = gw.rollout()
    url, headers = gw.search_url(rollout), {"authorization": f"Bearer {rollout['api_key']}"}

    def flood(n: int, workers: int = 32) -> list[int]:
        # As fast as this machine's clients go: `workers` threads, each on its own keep-alive
        # connection. Not one shared httpx client: past its 20 keep-alive connections, httpcore's
        # pool closes a connection it counts idle that another thread has just been handed, and
        # that thread's read fails with EBADF (a CI run failed so: the client's race, not the
        # gateway's).
        def worker(count: int) -> list[int]:
            with httpx.Client(timeout=60) as client:
                return [
                    client.post(url, json={"query": "Velmora"}, headers=headers).status_code
                    for _ in range(count)
                ]

        with ThreadPoolExecutor(workers) as pool:
            shares = [n // workers + (i < n % workers) for i in range(workers)]
            return [status for chunk in pool.map(worker, shares) for status in chunk]

    statuses = flood(2000)
    assert set(statuses) <= {200, 429}
    assert statuses.count(200) == 20
    assert len(gw.store.list_tool_requests(rollout["rollout_id"])) == 20  # every served search recorded
    health = httpx.get(f"{gw.url}/api/health")
    assert health.status_code == 200
    other = gw.rollout()  # the gateway still serves everyone else
    assert (
        post(gw.search_url(other), other["api_key"], {"query": "Tarsk"}).json()["passages"][0]["id"]
        == "tarsk"
    )


class HeldIndex:
    """The index, but a search waits until the test lets it go: a search in flight for as long as
    the test needs (a seam of ``RetrievalRoutes``, the index it is given)."""

    def __init__(self, index: object):
        self.index = index
        self.entered = threading.Event()
        self.release = threading.Event()

    def search(self, query: str, k: int, *, max_terms: int = 32) -> list:
        self.entered.set()
        if not self.release.wait(60):
            raise TimeoutError("the test never released the search")
        return self.index.search(query, k, max_terms=max_terms)  # type: ignore[attr-defined]


def test_a_search_in_flight_when_its_rollout_ends_is_refused_and_not_recorded(make_search_gateway) -> None:
    held: list[HeldIndex] = []
    gw = make_search_gateway(wrap_index=lambda index: held.append(HeldIndex(index)) or held[-1])
    rollout = gw.rollout()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, gw.search_url(rollout), rollout["api_key"], {"query": "Velmora"})
        assert held[0].entered.wait(60)  # authorized while running, now searching
        gw.client.cancel_rollout(rollout["rollout_id"])
        held[0].release.set()
        late = pending.result(timeout=60)
    assert late.status_code == 409 and late.json()["error"]["code"] == "rollout_closed", late.text
    assert gw.store.list_tool_requests(rollout["rollout_id"]) == []
    other = gw.rollout()  # control: a rollout still running gets its answer, recorded
    assert post(gw.search_url(other), other["api_key"], {"query": "Velmora"}).status_code == 200
    assert len(gw.store.list_tool_requests(other["rollout_id"])) == 1


def test_the_attempt_filter_takes_ascii_digits_only(make_search_gateway) -> None:
    gw = make_search_gateway()
    rollout = gw.rollout()
    assert post(gw.search_url(rollout), rollout["api_key"], {"query": "Velmora"}).status_code == 200
    url = f"{gw.url}/api/rollouts/{rollout['rollout_id']}/tool_requests"
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    # "²" and "٣" pass str.isdigit but not int(): they were a 500.
    for bad in ["²", "٣", "0²", "１", "-1", "+1", "1e3", " 0", "", "1" * 19]:
        answer = httpx.get(url, params={"attempt": bad}, headers=admin)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "attempt", (bad, answer.text)
    assert len(httpx.get(url, params={"attempt": "0"}, headers=admin).json()) == 1  # control
    assert httpx.get(url, params={"attempt": "1"}, headers=admin).json() == []


def test_a_query_at_the_character_limit_fits_the_body_cap_however_json_escapes_it(
    make_search_gateway,
) -> None:
    gw = make_search_gateway()  # max_query_chars = 1000
    rollout = gw.rollout()
    url, headers = gw.search_url(rollout), {"authorization": f"Bearer {rollout['api_key']}"}
    query = "Velmora " + "\N{WATER WAVE}" * 992  # 1000 characters; each wave is 12 bytes escaped
    body = json.dumps({"query": query, "top_k": 3}).encode()  # json.dumps's default: \ud83c\udf0a
    assert len(body) > 1000 * 4 + 1024  # past the old cap of 4 bytes a character
    answer = httpx.post(url, content=body, headers=headers)
    assert answer.status_code == 200 and answer.json()["query"] == query, answer.text
    too_long = httpx.post(url, content=json.dumps({"query": query + "x"}).encode(), headers=headers)
    assert too_long.status_code == 413 and "1001 characters" in too_long.json()["error"]["message"]


def test_a_rollout_whose_row_is_damaged_still_has_its_requests_served(make_search_gateway) -> None:
    """The log is rows of its own: a damaged rollout row (a disk, a bad writer) answered 409 for the
    whole log, as ``/api/rollouts/{id}/calls`` did before it served a damaged row's calls."""
    import sqlite3

    gw = make_search_gateway()
    broken, control = gw.rollout(), gw.rollout()
    for rollout in (broken, control):
        assert post(gw.search_url(rollout), rollout["api_key"], {"query": "Velmora"}).status_code == 200
    with sqlite3.connect(gw.store.local_file) as conn:
        conn.execute("UPDATE rollouts SET task = '{damaged' WHERE rollout_id = ?", (broken["rollout_id"],))
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    for rollout in (broken, control):
        listed = httpx.get(f"{gw.url}/api/rollouts/{rollout['rollout_id']}/tool_requests", headers=admin)
        assert listed.status_code == 200, listed.text
        assert [r["request"]["query"] for r in listed.json()] == ["Velmora"]
    unknown = httpx.get(f"{gw.url}/api/rollouts/nobody/tool_requests", headers=admin)
    assert unknown.status_code == 404  # the control: an unknown rollout is still refused


def test_a_rollout_past_its_search_budget_gets_a_tool_error_and_nothing_is_stored(
    make_search_gateway,
) -> None:
    """A looping policy searched at the rate limit for its whole timeout, each search stored with its
    passages (about 25 KB): the store grew without bound. Past ``max_searches_per_rollout`` a search
    is a 409 the client is told not to retry, and nothing more is recorded."""
    gw = make_search_gateway(max_searches_per_rollout=3)
    rollout, other = gw.rollout(), gw.rollout()
    url, key = gw.search_url(rollout), rollout["api_key"]
    assert [post(url, key, {"query": "Velmora"}).status_code for _ in range(3)] == [200, 200, 200]
    spent = post(url, key, {"query": "Velmora"})
    assert spent.status_code == 409 and spent.headers["x-should-retry"] == "false"
    assert "retrieval.max_searches_per_rollout" in spent.json()["error"]["message"]
    assert post(url, key, {"query": "Velmora"}).status_code == 409  # and stays spent
    assert len(gw.store.list_tool_requests(rollout["rollout_id"])) == 3
    # A malformed search is refused before it is counted; another rollout has its own budget.
    assert post(gw.search_url(other), other["api_key"], {"query": ""}).status_code == 400
    answers = [post(gw.search_url(other), other["api_key"], {"query": "Tarsk"}) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 409]


def test_the_search_budget_counts_searches_the_store_already_holds(make_search_gateway) -> None:
    """A restarted gateway (or a peer) starts a rollout's count from its recorded searches, not 0."""
    from harnessrl.schemas import ToolRequest

    gw = make_search_gateway(max_searches_per_rollout=3)
    rollout = gw.rollout()
    for _ in range(2):  # what the gateway serving it before this one recorded
        gw.store.add_tool_request(
            ToolRequest(rollout_id=rollout["rollout_id"], tool="search", request={"query": "x"})
        )
    url, key = gw.search_url(rollout), rollout["api_key"]
    assert [post(url, key, {"query": "Velmora"}).status_code for _ in range(2)] == [200, 409]
    assert len(gw.store.list_tool_requests(rollout["rollout_id"])) == 3


def test_a_damaged_search_row_does_not_stop_the_attempts_searches(make_search_gateway) -> None:
    """The budget of a restarted gateway is counted from the store; it read every search (passages
    and all) to count them, so one damaged row made every later search of the attempt a 409."""
    import sqlite3

    from harnessrl.schemas import ToolRequest

    gw = make_search_gateway(max_searches_per_rollout=3)
    rollout = gw.rollout()
    gw.store.add_tool_request(ToolRequest(rollout_id=rollout["rollout_id"], tool="search", request={"q": 1}))
    with sqlite3.connect(gw.store.local_file) as conn:
        conn.execute(
            "UPDATE tool_requests SET response = '{damaged' WHERE rollout_id = ?", (rollout["rollout_id"],)
        )
    assert gw.store.count_tool_requests(rollout["rollout_id"], attempt=0) == 1
    url, key = gw.search_url(rollout), rollout["api_key"]
    assert [post(url, key, {"query": "Velmora"}).status_code for _ in range(3)] == [200, 200, 409]
