"""A stand-in policy with a known skill per task, for ``data calibrate`` through the real stack.

The agent asks the model (every rollout makes a real, recorded call through the gateway), then
prints the model's reply on the first ``task[field]`` samples of its task (the sample index is the
last part of a calibration rollout id) and a wrong answer on the rest.
"""

from __future__ import annotations


def skilled_agent(field: str) -> str:
    """The agent's Python source; its task's ``field`` says how many samples it solves."""
    return f"""
import json, os, sys, urllib.request
req = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({{"model": "policy", "messages": [{{"role": "user", "content": sys.argv[1]}}]}}).encode(),
    headers={{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}},
)
reply = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"]
task = json.loads(os.environ["HARNESSRL_TASK"])
sample = int(os.environ["HARNESSRL_ROLLOUT_ID"].rsplit("-", 1)[1])
print(reply if sample < int(task[{field!r}]) else "Answer: 0")
"""
