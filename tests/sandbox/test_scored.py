"""``run_scored``: code a scorer runs (the agent's) cannot reach the scorer, inside a real sandbox.

A scorer runs in a bubblewrap sandbox as the one sandbox user; the code it scores runs as that same
user. The attacks: read the scorer's environment, open its memory for writing, write a verdict to
its stdout through ``/proc/<scorer>/fd/1``, signal it, read a file only the scorer should read (its
inputs), read its private folder, and leave a process behind that writes later. Each must fail under
``run_scored``; the control runs the same code with plain ``subprocess`` from the same scorer, where
each succeeds (so each probe notices success).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.sandbox import landlock
from harnessrl.sandbox.bwrap import sandbox_problem
from harnessrl.sandbox.host import LAUNCHER_ENV, SandboxHost

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
    ),
    pytest.mark.skipif(landlock.abi_version() < landlock.SCOPE_ABI, reason="needs Landlock ABI 6"),
]

# The code under test. It learns the scorer's pid (its grandparent: scorer -> launcher -> this) and
# the paths to try from argv, reports one JSON line, and leaves a daemon that writes a marker later.
ATTACK = r"""
import json, os, signal, sys, time
scorer, targets = int(sys.argv[1]), json.loads(sys.argv[2])
found = {}
def attempt(name, action):
    try:
        action()
        found[name] = True
    except OSError:
        found[name] = False
def read(path):
    with open(path, "rb") as f:
        return f.read(100)
attempt("environ", lambda: read(f"/proc/{scorer}/environ"))
attempt("mem_write", lambda: open(f"/proc/{scorer}/mem", "r+b").close())
attempt("stdout_write", lambda: open(f"/proc/{scorer}/fd/1", "a").write('{"reward": 1e300}\n'))
attempt("signal", lambda: os.kill(scorer, signal.SIGCONT))
attempt("read_input", lambda: read(targets["input"]))
attempt("read_private", lambda: os.listdir(targets["private"]))
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(5)  # run_scored must end it before: 5 s leave room for a loaded machine
        with open(targets["marker"], "w") as f:
            f.write("a leftover ran")
    os._exit(0)
print(json.dumps(found), flush=True)
"""

# The scorer, run inside the sandbox: the inputs and private folder live under /run/harnessrl, as in
# the command evaluator's sandbox. It runs the attack once as `mode` says and prints what it saw.
SCORER = r"""
import json, os, subprocess, sys
from pathlib import Path
from harnessrl.sandbox.scored import descendants, run_scored
mode, attack, workspace = sys.argv[1], sys.argv[2], Path(sys.argv[3])
targets = {"input": "/run/harnessrl/inputs/expected.txt", "private": os.environ["HARNESSRL_SCORER_DIR"],
           "marker": str(workspace / "leftover.txt")}
argv = [sys.executable, "-I", attack, str(os.getpid()), json.dumps(targets)]
env = {"PATH": os.environ["PATH"], "HOME": "/tmp"}
if mode == "scored":
    run = run_scored(argv, cwd=workspace, env=env, timeout_s=30)
    print(run.output.decode(), file=sys.stderr)
    found = json.loads(run.output.decode().strip().splitlines()[-1])
    # Dead, not merely slow: nothing below this scorer is left to write anything later.
    extra = {"isolation": run.isolation, "left": run.leftovers, "alive": len(descendants(os.getpid()))}
else:
    # The leftover holds the captured stdout: run() returns once it has done what it wanted.
    done = subprocess.run(argv, cwd=workspace, env=env, capture_output=True, text=True, timeout=30)
    found, extra = json.loads(done.stdout.strip().splitlines()[-1]), {}
print(json.dumps({"found": found, "leftover": (workspace / "leftover.txt").exists(), **extra}))
"""


def run_scorer(tmp_path: Path, mode: str) -> tuple[dict, str]:
    """Run SCORER in a real sandbox laid out like the evaluator's; its last stdout line and all of it."""
    scratch = tmp_path / mode
    for folder in ("ws", "inputs", "scorer"):
        (scratch / folder).mkdir(parents=True)
    (scratch / "inputs" / "expected.txt").write_text("what the tests expect")
    (scratch / "ws" / "attack.py").write_text(ATTACK)  # the agent's code lives in the workspace
    (scratch / "scorer.py").write_text(SCORER)
    from harnessrl.controller.evaluators.command import HARNESSRL_PACKAGE
    from harnessrl.sandbox.bwrap import Bind, python_install_paths

    host = SandboxHost()
    try:
        argv = host.launch_argv(
            scratch / "spec.json",
            sandbox="bwrap",
            command=[
                sys.executable,
                "-I",
                "/run/harnessrl/scorer.py",
                mode,
                str(scratch / "ws" / "attack.py"),
                str(scratch / "ws"),
            ],
            cwd=scratch / "ws",
            env={"HARNESSRL_SCORER_DIR": "/run/harnessrl/scorer", "HOME": "/run/harnessrl/scorer"},
            read_only=(*python_install_paths(), HARNESSRL_PACKAGE),
            binds=(
                Bind(scratch / "ws", scratch / "ws", writable=True),
                Bind(scratch / "scorer", Path("/run/harnessrl/scorer"), writable=True),
                Bind(scratch / "inputs", Path("/run/harnessrl/inputs")),
                Bind(scratch / "scorer.py", Path("/run/harnessrl/scorer.py")),
            ),
            network="none",
        )
        done = subprocess.run(argv, env=LAUNCHER_ENV, capture_output=True, text=True, timeout=120)
    finally:
        host.close()
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


def test_scored_code_cannot_reach_its_scorer(tmp_path):
    seen, stdout = run_scorer(tmp_path, "scored")
    assert seen["isolation"] == "landlock" and seen["left"] >= 1 and seen["alive"] == 0
    assert seen["found"] == {
        "environ": False,
        "mem_write": False,
        "stdout_write": False,
        "signal": False,
        "read_input": False,
        "read_private": False,
    }
    assert not seen["leftover"], "a process the scored code left ran after run_scored returned"
    assert "1e300" not in stdout


def test_control_plain_subprocess_lets_the_same_code_reach_its_scorer(tmp_path):
    seen, stdout = run_scorer(tmp_path, "plain")
    assert all(seen["found"].values()), seen["found"]
    assert seen["leftover"] and '{"reward": 1e300}' in stdout  # its forged verdict is in the scorer's output
