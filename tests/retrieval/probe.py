"""A hostile harness with the search tool: it uses the retriever as intended (the control that the
relay reaches it), then tries to get more out of it or around it. Run by ``harnessrl rollout``
(preset ``python``); reads its targets from the task's visible ``targets`` and prints one JSON line
``{"probes": {NAME: {"succeeded": bool, "evidence": "..."}}}``. Standard library only."""

import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

T = json.loads(os.environ["HARNESSRL_TASK"])["targets"]
SECRET = T["secret_reversed"][::-1]  # reversed in the task: the visible task must not hold it
REPORT = {}


def probe(name, fn):
    try:
        ok, evidence = fn()
    except Exception as exc:  # a probe that raised did not succeed
        ok, evidence = False, f"{type(exc).__name__}: {exc}"
    REPORT[name] = {"succeeded": bool(ok), "evidence": str(evidence)[:300]}


def search_command(query):
    done = subprocess.run(["search", query], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def search_http(query):
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")[: -len("/v1")]
    request = urllib.request.Request(
        base + "/search",
        data=json.dumps({"query": query}).encode(),
        headers={
            "authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "content-type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def read_file(path):
    with open(path, "rb") as f:
        return True, f.read(200)


def socket_to_host_port():
    with socket.create_connection(("127.0.0.1", int(T["listener_port"])), timeout=3) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        return True, s.recv(100)


def curl_to_host_port():
    done = subprocess.run(
        ["curl", "-s", "-m", "3", f"http://127.0.0.1:{T['listener_port']}/"], capture_output=True
    )
    return done.returncode == 0, f"exit {done.returncode}"


def path_tricks():
    leaked = []
    for query in [
        T["secret_path"],
        "file://" + T["secret_path"],
        "../" * 8 + "etc/passwd",
        SECRET,
        "/etc/shadow",
    ]:
        status, text = search_http(query)
        passages = json.loads(text).get("passages", []) if status == 200 else []
        if any(SECRET in p["text"] or "root:" in p["text"] for p in passages):
            leaked.append(query)
    return bool(leaked), leaked


def flood():
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda _: search_http("Velmora")[0], range(400)))
    crashed = [s for s in statuses if s not in (200, 429)]
    alive = search_http("Velmora")[0] in (200, 429)
    return bool(crashed) or not alive, {
        "200": statuses.count(200),
        "429": statuses.count(429),
        "other": crashed[:5],
    }


probe(
    "search_command_works",
    lambda: (lambda rc, out: (rc == 0 and "founded in 1432" in out, out))(*search_command("Velmora")),
)


def huge_query_refused():
    """A 160 kB query: answered 413, or the connection closed while the body was still being sent (the
    gateway refuses on the declared length and closes; the client may see that before the 413).
    Either way the gateway must go on answering."""
    try:
        status, _ = search_http("Velmora " * 20000)
        refused, evidence = status == 413, status
    except (ConnectionError, urllib.error.URLError) as exc:
        refused, evidence = True, f"closed while the body was sent: {exc!r}"
    code, _ = search_command("Velmora")
    return refused and code == 0, f"{evidence}; answers afterwards: {code == 0}"


probe("huge_query_refused", huge_query_refused)
probe("python_socket_to_a_host_port", socket_to_host_port)
probe("curl_to_a_host_port", curl_to_host_port)
probe("read_the_corpus_file", lambda: read_file(T["corpus"]))
probe("read_the_index_folder", lambda: (True, os.listdir(T["index_dir"])))
probe("read_the_secret_beside_the_corpus", lambda: read_file(T["secret_path"]))
probe("secret_through_path_tricks_in_queries", path_tricks)
probe("flood_crashes_the_gateway", flood)
print(json.dumps({"probes": REPORT}))
