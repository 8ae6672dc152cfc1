"""Red team: a policy's answer attacks the ``reasoning_gym`` evaluator that scores it.

Several reasoning-gym scorers evaluate the answer as code (``eval`` in string_insertion, spiral_matrix,
binary_matrix, n_queens; ``sympy.parse_expr`` in countdown, polynomial_multiplication, the integration
datasets). Scored in the controller, ``Answer: <python>`` ran with the controller's privileges. Each
attack below is one such answer, sent through ``build_evaluator({"type": "reasoning_gym"}).evaluate``
as a real rollout's final message; each must earn nothing, change nothing outside its scorer, and
never turn into an infrastructure failure. Each has a control showing the probe would notice success
(the marker path is writable, a connection from the test arrives, the victim process can be killed,
the ticker sees a blocked loop).

The second half attacks the confinement itself (``harnessrl.sandbox.forked``) with code that does
run (no code guard), so it holds even where an answer found a way past the guard.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harnessrl.controller.evaluators import EvaluationInput, EvaluationResult, EvaluatorError, build_evaluator
from harnessrl.sandbox import landlock
from harnessrl.sandbox.bwrap import sandbox_problem
from harnessrl.schemas import Call
from harnessrl.tasks.reasoning_gym import reasoning_gym_tasks

pytestmark = pytest.mark.skipif(
    landlock.abi_version() < 1, reason="the reasoning_gym evaluator refuses to score without Landlock"
)
PY = sys.executable


def call(text: str) -> Call:
    return Call(
        rollout_id="r",
        seq=0,
        response={"choices": [{"message": {"role": "assistant", "content": text}}]},
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=[0.0],
    )


def task_of(dataset: str, index: int = 0) -> dict[str, Any]:
    return reasoning_gym_tasks(dataset, size=index + 1, seed=0)[index].data


def score(evaluator: Any, task: dict[str, Any], text: str) -> EvaluationResult:
    inp = EvaluationInput(task=task, workspace=Path("/tmp"), calls=[call(text)])
    return asyncio.run(evaluator.evaluate(inp))


async def with_ticker(work: Awaitable[Any]) -> tuple[Any, float]:
    """``work``'s result and the longest the event loop went without running a 20 ms ticker."""
    worst, done = 0.0, False

    async def tick() -> None:
        nonlocal worst
        last = time.monotonic()
        while not done:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            worst, last = max(worst, now - last), now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    try:
        result = await work
    finally:
        done = True
        await ticker
    return result, worst


def close(evaluator: Any) -> None:
    aclose = getattr(evaluator, "aclose", None)
    if aclose is not None:
        asyncio.run(aclose())


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Any]:
    ev = build_evaluator({"type": "reasoning_gym"})
    yield ev
    close(ev)


@pytest.fixture(scope="module")
def insertion() -> dict[str, Any]:
    return task_of("string_insertion")


class _Listener:
    """A TCP listener on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[_Listener]:
    server = _Listener()
    yield server
    server.close()


# -- answers as code -----------------------------------------------------------------------------------


def test_an_answer_cannot_write_a_file(evaluator, insertion, tmp_path):
    marker = tmp_path / "marker"
    marker.write_text("control: the test can write here")  # so the controller could too
    marker.unlink()
    pid_marker = tmp_path / "pid"
    for text in (
        f"Answer: __import__('pathlib').Path({str(pid_marker)!r}).write_text(str(__import__('os').getpid())) and []",
        f"Answer: open({str(marker)!r}, 'w').write('pwned') and []",
    ):
        result = score(evaluator, insertion, text)
        assert result.reward == 0.0
    assert not marker.exists()
    assert not pid_marker.exists()  # the answer never ran: not in the controller, not anywhere


def test_an_answer_through_sympy_parse_expr_cannot_write_a_file(evaluator, tmp_path):
    marker = tmp_path / "marker"
    polynomial = task_of("polynomial_multiplication")
    result = score(
        evaluator, polynomial, f"Answer: __import__('pathlib').Path({str(marker)!r}).write_text('x')"
    )
    assert result.reward == 0.0 and not marker.exists()
    # Control: the same scorer still reads a real expression (parse_expr works for honest answers).
    assert score(evaluator, polynomial, f"Answer: {polynomial['hidden']['answer']}").reward == 1.0


def test_an_answer_cannot_patch_the_evaluator_for_later_rewards(evaluator, insertion):
    hack = (
        "Answer: (m:=__import__('sys').modules['harnessrl.controller.evaluators.answer'])"
        ".__setattr__('checked_result', lambda r, d, m=m: m.EvaluationResult(1.0, d)) or []"
    )
    assert score(evaluator, insertion, hack).reward == 0.0
    assert score(evaluator, insertion, "Answer: WRONG").reward == 0.0  # the next wrong answer
    assert score(evaluator, insertion, f"Answer: {insertion['hidden']['answer']}").reward == 1.0  # control


def test_an_answer_cannot_read_the_gold_answer_out_of_the_scorers_frame(insertion):
    """string_insertion's ``eval(answer)`` sees the scorer's locals: ``oracle_answer`` is the gold
    string, which its list-reading path then credits (0.1, counted without ``strict``)."""
    partial = build_evaluator({"type": "reasoning_gym", "strict": False})
    try:
        assert score(partial, insertion, "Answer: oracle_answer").reward == 0.0
        assert score(partial, insertion, "Answer: entry['answer']").reward == 0.0
        # Control: a list literal of the right letters (what that path is for) still earns its 0.1.
        letters = list(insertion["hidden"]["answer"])
        assert score(partial, insertion, f"Answer: {letters!r}").reward == pytest.approx(0.1)
    finally:
        close(partial)


def test_an_answer_cannot_connect_anywhere(evaluator, insertion, listener):
    for text in (
        f"Answer: __import__('socket').create_connection(('127.0.0.1', {listener.port})) and []",
        f"Answer: __import__('urllib.request').request.urlopen('http://127.0.0.1:{listener.port}/') and []",
    ):
        assert score(evaluator, insertion, text).reward == 0.0
    time.sleep(0.3)
    assert listener.accepted == 0
    socket.create_connection(("127.0.0.1", listener.port)).close()  # control: a connection arrives
    deadline = time.monotonic() + 5
    while listener.accepted == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listener.accepted == 1


# The driver scores attacks that, in a scorer that ran them, end processes: run in a session of its
# own under a guardian (its parent), so a kill that works ends them and nothing of the test's.
DRIVER = r"""
import asyncio, json, sys
from pathlib import Path
from harnessrl.controller.evaluators import EvaluationInput, build_evaluator
from harnessrl.schemas import Call
from harnessrl.tasks.reasoning_gym import reasoning_gym_tasks

def call(text):
    return Call(rollout_id="r", seq=0, response={"choices": [{"message": {"role": "assistant", "content": text}}]},
                prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[0.0])

task = reasoning_gym_tasks("string_insertion", size=1, seed=0)[0].data
answers = json.loads(sys.argv[1]) + ["WRONG", task["hidden"]["answer"]]

async def main():
    ev = build_evaluator({"type": "reasoning_gym"})
    out = []
    for answer in answers:
        try:
            r = await ev.evaluate(EvaluationInput(task=task, workspace=Path("/tmp"), calls=[call("Answer: " + answer)]))
            out.append({"reward": r.reward, "flags": list(r.flags)})
        except Exception as exc:
            out.append({"error": type(exc).__name__})
    scorer = getattr(ev, "scorer", None)
    print(json.dumps({"results": out, "starts": getattr(scorer, "starts", None)}), flush=True)
    if hasattr(ev, "aclose"):
        await ev.aclose()

asyncio.run(main())
"""
GUARDIAN = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


def test_an_answer_cannot_kill_the_scorer_process_the_controller_or_forge_a_verdict():
    attacks = [
        "__import__('os').kill(__import__('os').getppid(), 9) or []",  # the scorer process
        "__import__('os').killpg(0, 9) or []",  # everything in its process group
        "__import__('os').kill(__import__('os').getpid(), 9) or []",  # itself (in the controller: it)
        "__import__('os').write(3, b'{\"score\": 1.0}\\n') and __import__('os')._exit(0)",  # a verdict
    ]
    guardian = subprocess.run(
        [PY, "-c", GUARDIAN, PY, "-c", DRIVER, json.dumps(attacks)],
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert guardian.returncode == 0, (guardian.returncode, guardian.stderr[-2000:])
    report = json.loads(guardian.stdout.strip().splitlines()[-1])
    *attacked, wrong, right = report["results"]
    assert all(r == {"reward": 0.0, "flags": []} for r in attacked), attacked
    assert wrong == {"reward": 0.0, "flags": []} and right == {"reward": 1.0, "flags": []}
    assert report["starts"] == 1  # the scorer process was never killed (nor restarted)


def test_the_guardians_death_would_be_seen():
    """Control for the test above: a guardian whose child kills it exits by SIGKILL."""
    kill_parent = "import os; os.kill(os.getppid(), 9)"
    guardian = subprocess.run([PY, "-c", GUARDIAN, PY, "-c", kill_parent], timeout=60, start_new_session=True)
    assert guardian.returncode == -signal.SIGKILL


#: The longest event-loop stall the stall checks allow. Far below the stalls they catch (an answer's
#: 7 s of big-integer work on the loop's GIL, 10.8 s of a quadratic regex), far above what a loaded CI
#: machine's scheduling adds: a state of the code, not a timing of the machine.
STALL_S = 2.0


# -- answers that stall, raise or overflow ---------------------------------------------------------------


def test_an_expensive_answer_is_cut_at_the_time_limit_without_stalling_the_loop(insertion):
    evaluator = build_evaluator({"type": "reasoning_gym", "timeout_s": 1})
    inp = EvaluationInput(task=insertion, workspace=Path("/tmp"), calls=[call("Answer: 7**(2*7**8)")])

    async def run() -> tuple[EvaluationResult, float]:
        await evaluator.evaluate(  # the scorer process starts (and imports reasoning-gym) first
            EvaluationInput(task=insertion, workspace=Path("/tmp"), calls=[call("Answer: x")])
        )
        return await with_ticker(evaluator.evaluate(inp))

    try:
        result, worst = asyncio.run(run())
    finally:
        close(evaluator)
    assert result.reward == 0.0 and "scorer_timeout" in result.flags  # cut at its limit
    assert worst < STALL_S, f"the event loop stalled for {worst:.2f}s"


def test_the_ticker_sees_a_blocked_loop():
    """Control for the stall checks: work that holds the loop shows up in the ticker."""

    async def blocking() -> None:
        time.sleep(STALL_S + 0.3)

    _, worst = asyncio.run(with_ticker(blocking()))
    assert worst > STALL_S


@pytest.mark.parametrize(
    ("dataset", "answer"),
    [("prime_factorization", "I don't know"), ("boxnet", "1e99999")],
)
def test_an_answer_that_makes_the_scorer_raise_scores_zero_with_a_flag(evaluator, dataset, answer):
    """Not an EvaluatorError: that would be retried and left out of the group's baseline, turning
    the policy's 0 into "not counted"."""
    task = task_of(dataset)
    result = score(evaluator, task, f"Answer: {answer}")
    assert result.reward == 0.0 and "scorer_raised" in result.flags
    assert result.details["scorer_error"]


def test_a_raising_answer_does_not_change_right_and_wrong_ones(evaluator):
    task = task_of("prime_factorization")
    assert score(evaluator, task, "Answer: I don't know").flags == ("scorer_raised",)
    assert score(evaluator, task, f"Answer: {task['hidden']['answer']}").reward == 1.0  # control
    assert score(evaluator, task, "Answer: 2 × 3").reward == 0.0


def test_a_malformed_task_is_still_an_infrastructure_failure(evaluator):
    with pytest.raises(EvaluatorError, match="dataset"):
        score(evaluator, {"question": "q", "hidden": {"answer": "7"}}, "Answer: 7")


def test_think_blocks_in_stdout_do_not_stall_the_loop(insertion):
    """``<think>.*?</think>`` is quadratic on an unclosed ``<think>`` run: 128 KiB of it held the event
    loop for 10.8 s (a worker thread would too: the regex holds the GIL). Both answer evaluators now
    remove ``<think>`` blocks in linear time."""
    stdout = "<think>" * (128 * 1024 // len("<think>")) + "\nAnswer: 7"
    evaluator = build_evaluator({"type": "reasoning_gym", "source": "stdout", "timeout_s": 1})
    inp = EvaluationInput(task=insertion, workspace=Path("/tmp"), stdout=stdout)
    try:
        result, worst = asyncio.run(with_ticker(evaluator.evaluate(inp)))
    finally:
        close(evaluator)
    assert result.reward == 0.0
    assert worst < STALL_S, f"the event loop stalled for {worst:.2f}s"

    exact = build_evaluator({"type": "exact_match", "source": "stdout", "pattern": r"Answer:\s*(.+)"})
    inp = EvaluationInput(
        task={"prompt": "q", "hidden": {"answer": "7"}}, workspace=Path("/tmp"), stdout=stdout
    )
    result, worst = asyncio.run(with_ticker(exact.evaluate(inp)))
    assert result.reward == 1.0
    assert worst < STALL_S, f"the event loop stalled for {worst:.2f}s"


def test_concurrent_evaluations_are_each_scored_right(evaluator):
    tasks = [t.data for t in reasoning_gym_tasks("basic_arithmetic", size=20, seed=3)]
    inputs = [
        EvaluationInput(
            task=task,
            workspace=Path("/tmp"),
            calls=[call(f"Answer: {task['hidden']['answer'] if i % 3 else 'nope'}")],
        )
        for i, task in enumerate(tasks)
    ]

    async def run() -> list[EvaluationResult]:
        return await asyncio.gather(*(evaluator.evaluate(inp) for inp in inputs))

    results = asyncio.run(run())
    assert [r.reward for r in results] == [1.0 if i % 3 else 0.0 for i in range(20)]
    assert [r.details["extracted"] for r in results] == [
        t["hidden"]["answer"] if i % 3 else "nope" for i, t in enumerate(tasks)
    ]


# -- the confinement itself, against code that runs ------------------------------------------------------

PROBE = r"""
import json, os, socket, sys
from harnessrl.sandbox import forked

args = json.loads(sys.argv[1])
confinement = forked.prepare()

def attempt(what, fn):
    try:
        return what, "done: " + str(fn())[:80]
    except BaseException as exc:
        return what, "refused: " + type(exc).__name__

def attacks():
    yield attempt("write_file", lambda: open(args["marker"], "w").write("pwned"))
    yield attempt("read_secret", lambda: open(args["secret"]).read())
    yield attempt("connect", lambda: socket.create_connection(("127.0.0.1", args["port"]), timeout=2).close())
    yield attempt("kill_victim", lambda: os.kill(args["victim"], 9))
    yield attempt("fork", lambda: os.waitpid(pid, 0) if (pid := os.fork()) else os._exit(0))
    if args["confined"]:  # had it worked, the child would be `true` now and report nothing
        yield attempt("exec", lambda: os.execv("/bin/true", ["true"]))
    else:
        yield attempt("exec", lambda: os.waitpid(p, 0) if (p := os.fork()) else os.execv("/bin/true", ["true"]))
    yield attempt("read_driver_environ", lambda: open(f"/proc/{os.getppid()}/environ").read())
    yield attempt("allocate_2gb", lambda: len(bytearray(2 << 30)))
    if args["confined"]:  # unconfined, this would end the driver: only the confined child tries
        yield attempt("kill_parent", lambda: os.kill(os.getppid(), 9))

read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    fd = write
    if args["confined"]:
        fd = confinement.enter(write, cpu_seconds=10, memory_bytes=256 << 20)
    os.write(fd, json.dumps(dict(attacks())).encode())
    os._exit(0)
os.close(write)
chunks = []
while chunk := os.read(read, 65536):
    chunks.append(chunk)
os.waitpid(pid, 0)
print(json.dumps({"level": confinement.level, "results": json.loads(b"".join(chunks))}))
"""


def _probe(tmp_path: Path, port: int, victim: int, *, confined: bool) -> dict[str, Any]:
    args = {
        "marker": str(tmp_path / f"marker-{confined}"),
        "secret": str(tmp_path / "secret"),
        "port": port,
        "victim": victim,
        "confined": confined,
    }
    env = {**os.environ, "HARNESSRL_PROBE_SECRET": "admin-key-7f3a"}
    done = subprocess.run(
        [PY, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_confined_child_reaches_nothing_but_its_result_pipe(tmp_path, listener):
    (tmp_path / "secret").write_text("gold")
    victim = subprocess.Popen(["sleep", "600"])  # outlives the probe (up to 120 s) on a loaded machine
    try:
        report = _probe(tmp_path, listener.port, victim.pid, confined=True)
        assert report["level"] == "full"
        results = report["results"]
        refused = {what for what, outcome in results.items() if outcome.startswith("refused")}
        assert refused == set(results), results
        assert not (tmp_path / "marker-True").exists()
        assert listener.accepted == 0
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()


def test_an_unconfined_child_reaches_all_of_it(tmp_path, listener):
    """Control: the same attacks from a plain forked child succeed, so each probe can see success."""
    (tmp_path / "secret").write_text("gold")
    victim = subprocess.Popen(["sleep", "600"])  # outlives the probe (up to 120 s) on a loaded machine
    try:
        results = _probe(tmp_path, listener.port, victim.pid, confined=False)["results"]
        assert all(outcome.startswith("done") for outcome in results.values()), results
        assert (tmp_path / "marker-False").read_text() == "pwned"
        assert victim.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while listener.accepted == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listener.accepted == 1
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


# -- end to end: harnessrl rollout, the controller, the evaluator ----------------------------------------

AGENT = Path(__file__).resolve().parents[2] / "examples" / "calculator_agent" / "agent.py"


@pytest.mark.skipif(os.geteuid() != 0, reason="the harness sandbox needs root here")
@pytest.mark.skipif(sandbox_problem() is not None, reason=f"no harness sandbox here: {sandbox_problem()}")
def test_an_attack_through_harnessrl_rollout_earns_nothing_and_a_right_answer_still_scores(tmp_path):
    task = task_of("string_insertion")
    marker = tmp_path / "marker"
    (tmp_path / "task.json").write_text(json.dumps(task))
    answers = {
        "attack": f"Answer: __import__('pathlib').Path({str(marker)!r}).write_text('x') and []",
        "right": f"Answer: {task['hidden']['answer']}",
    }
    summaries = {}
    for name, content in answers.items():
        script = tmp_path / f"{name}.json"
        script.write_text(json.dumps({"turns": [{"content": content}], "on_exhausted": "repeat_last"}))
        config = tmp_path / f"{name}.toml"
        config.write_text(
            f'[engine]\nmodel = "scripted:{script}"\n'
            f'[harness]\npreset = "python"\ncommand = ["{AGENT}", "{{prompt}}"]\ntimeout_s = 60\n'
            '[evaluator]\ntype = "reasoning_gym"\n[controller]\nmax_infra_retries = 1\n'
        )
        done = subprocess.run(
            [
                PY,
                "-m",
                "harnessrl",
                "rollout",
                "--config",
                str(config),
                "--task",
                f"@{tmp_path / 'task.json'}",
            ]
            + ["--run-dir", str(tmp_path / f"run-{name}")],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Traceback" not in done.stderr, done.stderr[-3000:]  # nothing left behind at exit
        summaries[name] = json.loads(done.stdout.strip().splitlines()[-1])
    assert summaries["attack"]["outcome"] == "success" and summaries["attack"]["reward"] == 0.0
    assert summaries["right"]["outcome"] == "success" and summaries["right"]["reward"] == 1.0
    assert not marker.exists()
