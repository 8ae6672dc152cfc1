"""A harness that hunts for the teacher's upstream key from inside its sandbox (teacher mode, issue 42).

Run by ``harnessrl rollout`` (preset ``python``) against a gateway in teacher mode. It is told the
key reversed (task field ``key_reversed``: the visible task must not itself contain it) and searches,
for the key and for its base64 form:

- ``env``: its own environment;
- ``proc``: ``/proc/*/environ``, ``/proc/*/cmdline`` and ``/proc/*/maps`` of every process it can see;
- ``files``: every regular file it can read (under ``/``, ``/proc``, ``/sys`` and ``/dev`` aside;
  the first 4 MiB of each), its home and workspace included;
- ``relay``: every answer the gateway gives it: chat, Messages and Responses calls, whole and
  streamed, calls the upstream refuses (its error message echoes the key it was sent), the model
  list, and the gateway's other routes its rollout key can call — bodies and headers.

Prints one JSON line: ``{"key_probe": {channel: [where found, ...]}, "searched": {...}, "answers": n}``.
Standard library only.
"""

import base64
import json
import os
import time
import urllib.error
import urllib.request

TASK = json.loads(os.environ.get("HARNESSRL_TASK", "{}"))
KEY = TASK["key_reversed"][::-1]
NEEDLES = [KEY.encode(), base64.b64encode(KEY.encode())]
FOUND = {"env": [], "proc": [], "files": [], "relay": []}
SEARCHED = {"env": 0, "proc": 0, "files": 0, "relay": 0}
STARTED = time.monotonic()
SECONDS = {}


def hit(blob):
    return any(n in blob for n in NEEDLES)


def note(channel, where, blob):
    SEARCHED[channel] += 1
    if hit(blob):
        FOUND[channel].append(where)


def read(path, limit=4 << 20):
    with open(path, "rb") as f:
        return f.read(limit)


# -- env ----------------------------------------------------------------------------------------------
for name, value in os.environ.items():
    note("env", name, f"{name}={value}".encode())

# -- /proc --------------------------------------------------------------------------------------------
for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["self", "thread-self"]:
    for part in ("environ", "cmdline", "maps"):
        try:
            note("proc", f"/proc/{pid}/{part}", read(f"/proc/{pid}/{part}"))
        except OSError:
            continue

# -- files --------------------------------------------------------------------------------------------
SKIP = ("/proc", "/sys", "/dev")
for root, dirs, files in os.walk("/", onerror=lambda e: None):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in SKIP]
    for name in files:
        path = os.path.join(root, name)
        try:
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            note("files", path, read(path))
        except OSError:
            continue

SECONDS["files"] = round(time.monotonic() - STARTED, 1)

# -- the relay: what the gateway answers --------------------------------------------------------------
BASE = os.environ["OPENAI_BASE_URL"].rstrip("/")  # .../rollouts/<id>/v1
ROOT = BASE.split("/rollouts/")[0]
KEY_HEADERS = {
    "authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
    "x-api-key": os.environ["OPENAI_API_KEY"],
}
ANSWERS = 0


def call(method, url, body=None):
    global ANSWERS
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={**KEY_HEADERS, "content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            blob, headers = response.read(), str(response.headers)
    except urllib.error.HTTPError as exc:
        blob, headers = exc.read(), str(exc.headers)
    except OSError as exc:
        blob, headers = repr(exc).encode(), ""
    ANSWERS += 1
    note("relay", f"{method} {url}", blob + headers.encode())


TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}
]
for word in ("hello", "FAIL"):  # FAIL: the upstream refuses, echoing the key it got
    for stream in (False, True):
        call(
            "POST",
            f"{BASE}/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": word}], "tools": TOOLS, "stream": stream},
        )
        call(
            "POST",
            f"{BASE}/messages",
            {
                "model": "m",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": word}],
                "stream": stream,
            },
        )
        call("POST", f"{BASE}/responses", {"model": "m", "input": word, "stream": stream})
call("POST", f"{BASE}/completions", {"model": "m", "prompt": "hello"})
call("POST", f"{BASE}/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
for path in ("/models", "/models/m"):
    call("GET", BASE + path)
rollout = os.environ["HARNESSRL_ROLLOUT_ID"]
for path in (
    "/health",
    "/api/health",
    "/metrics",
    "/v1/models",
    f"/api/rollouts/{rollout}",
    f"/api/rollouts/{rollout}/calls",
    "/api/config",
    "/ui",
):
    call("GET", ROOT + path)

SECONDS["all"] = round(time.monotonic() - STARTED, 1)
print(
    json.dumps({"key_probe": FOUND, "searched": SEARCHED, "answers": ANSWERS, "seconds": SECONDS}), flush=True
)
