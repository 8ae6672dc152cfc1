"""``search "query"``: the retriever as a shell command, run inside a harness's sandbox.

Standard library only, and no harnessrl import: the sandbox binds this one file, not the project.
It posts the query to the rollout's search route on the gateway (the base URL and key the controller
gave the harness: ``OPENAI_BASE_URL`` = ``.../rollouts/<id>/v1``, ``OPENAI_API_KEY``; or
``--base-url`` / ``--api-key``) and prints the passages, best first. Exit status 0 with passages or
none found, 1 when the gateway refused (the reason on stderr), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import urllib.error
import urllib.request


def search_url(base_url: str) -> str:
    """``http://host:port/rollouts/<id>/v1`` -> ``http://host:port/rollouts/<id>/search``."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + "/search"


def search(
    query: str, *, base_url: str, api_key: str, top_k: int | None = None, timeout_s: float = 30.0
) -> dict:
    """The gateway's answer ``{"query", "passages": [{"id", "title", "text", "score"}]}``; raises
    ``RuntimeError`` with the gateway's message when it refuses."""
    body: dict = {"query": query}
    if top_k is not None:
        body["top_k"] = top_k
    request = urllib.request.Request(
        search_url(base_url),
        # UTF-8 as is, not \u escapes (6 to 12 bytes a character on the wire, past the route's cap);
        # a lone surrogate (argv's undecodable bytes) stays an escape.
        data=json.dumps(body, ensure_ascii=False).encode("utf-8", "backslashreplace"),
        headers={"authorization": f"Bearer {api_key}", "content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return _passages_answer(answer.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError, OSError, http.client.HTTPException):  # cut short too
            message = exc.reason
        raise RuntimeError(f"search refused ({exc.code}): {message}") from None
    except (OSError, http.client.HTTPException) as exc:  # IncompleteRead: the answer was cut short
        raise RuntimeError(f"search failed: {exc}") from None


def _passages_answer(raw: bytes) -> dict:
    """The answer's JSON when it is ``{"passages": [{"title", "text", ...}, ...]}``, else
    ``RuntimeError``: a reply that is not that shape was a traceback from ``format_passages``."""
    try:
        answer = json.loads(raw)
    except ValueError:
        raise RuntimeError(f"search failed: the gateway's answer is not JSON: {raw[:80]!r}") from None
    passages = answer.get("passages") if isinstance(answer, dict) else None
    if not isinstance(passages, list) or not all(
        isinstance(p, dict) and isinstance(p.get("title"), str) and isinstance(p.get("text"), str)
        for p in passages
    ):
        raise RuntimeError(f"search failed: the gateway's answer holds no passages: {raw[:80]!r}")
    return answer


def format_passages(passages: list) -> str:
    if not passages:
        return "No passages found."
    return "\n\n".join(f"[{i}] {p['title']}\n{p['text']}" for i, p in enumerate(passages, start=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="search", description="Search the corpus; prints the best passages."
    )
    parser.add_argument("query", nargs="+", help="words to search for")
    parser.add_argument("-k", "--top-k", type=int, default=None, help="how many passages")
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", ""))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""))
    args = parser.parse_args(argv)
    if not args.base_url or not args.api_key:
        print("search: no gateway (OPENAI_BASE_URL and OPENAI_API_KEY are unset)", file=sys.stderr)
        return 2
    try:
        answer = search(" ".join(args.query), base_url=args.base_url, api_key=args.api_key, top_k=args.top_k)
    except RuntimeError as exc:
        print(f"search: {exc}", file=sys.stderr)
        return 1
    print(format_passages(answer.get("passages", [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
