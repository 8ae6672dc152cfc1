"""A minimal chat agent using only the standard library (urllib): one request to the OpenAI-compatible
endpoint in OPENAI_BASE_URL with OPENAI_API_KEY, prints the reply. Starts in milliseconds, which is
what the tiny-model training test wants; it knows nothing about harnessrl."""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def main() -> None:
    body = {
        "model": os.environ.get("HARNESSRL_MODEL", "policy"),
        "messages": [{"role": "user", "content": sys.argv[1]}],
        "max_tokens": 32,
    }
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        reply = json.load(response)
    print(reply["choices"][0]["message"]["content"] or "")


if __name__ == "__main__":
    main()
