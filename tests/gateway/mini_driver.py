"""Run unmodified mini-swe-agent against a harnessrl gateway; meant to run inside ``unshare -n``.

Used by ``test_mini_swe_agent.py``: starts ``python -m harnessrl.gateway`` with a scripted policy on a
store file, creates a rollout, runs the ``mini`` CLI (its default ``mini.yaml`` tool-calling config)
in a workspace with the rollout's base URL and key, finishes the rollout, stops the gateway, and
writes a JSON summary. Usage: ``python mini_driver.py SCRIPT STORE WORKDIR SUMMARY``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from harnessrl.client import GatewayClient

ADMIN_KEY = "mini-admin"
TASK = "Create a file result.txt in the current directory containing the line 'hello harnessrl'."


def main(script: str, store: str, workdir: str, summary_path: str) -> int:
    env = {**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN_KEY}
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harnessrl.gateway",
            "--model",
            f"scripted:{script}",
            "--port",
            "0",
            "--store",
            store,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert gateway.stdout is not None
    url = None
    log: list[str] = []
    for line in gateway.stdout:
        log.append(line)
        if match := re.search(r"listening on (http://\S+)", line):
            url = match.group(1)
            break
    if url is None:
        print("".join(log), file=sys.stderr)
        return 3
    threading.Thread(target=lambda: log.extend(gateway.stdout), daemon=True).start()  # type: ignore[arg-type]
    try:
        admin = GatewayClient(url, ADMIN_KEY)
        admin.wait_ready(timeout=30)
        rollout = admin.create_rollout({"prompt": TASK}, rollout_id="mini-1")
        mini_env = {
            **os.environ,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        mini = subprocess.run(
            [
                str(Path(sys.executable).with_name("mini")),
                "-y",
                "--exit-immediately",
                "-m",
                "openai/harnessrl-policy",
                "-c",
                "mini.yaml",
                "-c",
                f"model.model_kwargs.api_base={rollout['base_url']}",
                "-c",
                f"model.model_kwargs.api_key={rollout['api_key']}",
                "-t",
                TASK,
                "-o",
                str(Path(workdir).parent / "trajectory.json"),
            ],
            cwd=workdir,
            env=mini_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=240,
        )
        admin.finish_rollout(rollout["rollout_id"], "success", 1.0)
        summary = {
            "rollout_id": rollout["rollout_id"],
            "returncode": mini.returncode,
            "stdout": mini.stdout[-4000:],
            "stderr": mini.stderr[-4000:],
        }
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=30)
    summary["gateway_log"] = "".join(log)[-4000:]
    Path(summary_path).write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
