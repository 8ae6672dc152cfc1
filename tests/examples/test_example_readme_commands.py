"""What the examples' READMEs and config headers tell a user to type works as written: the
arithmetic, coding, shell_agent, scienceworld and tiny examples.

Every command shown there is read out of the files (README code and inline code, the ``#`` header
of each ``.toml``) and checked the way a user would meet it from the repository root: each path it
names exists (or, under a ``runs/`` folder, is the run folder that config writes), each
``harnessrl train CONFIG --set k=v`` validates with its overrides. And the LoRA config is what its
README says: train.toml with adapters, their learning rate and its own run name, nothing else.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MINE = ("arithmetic", "coding", "shell_agent", "scienceworld", "tiny")
# Folders a README's command creates: built or written by the command itself, not shipped.
OUTPUT_OPTIONS = {"--out", "--run-dir"}
TOP_FOLDERS = {"examples", "benchmarks", "docs", "src", "tests", "tasks", "runs"}
COMMAND = re.compile(r"(?:^|`|\s)((?:\.venv/bin/)?(?:harnessrl|python|pip|tail)\b[^`\n]*)")


def _flatten(table: dict, prefix: str = "") -> dict:
    out: dict = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _documented_commands(example: str) -> list[tuple[str, str]]:
    """(where, command) for each command line in the example's README and its configs' headers;
    continuation lines (``\\``) joined, ``#`` comments after a command dropped."""
    found: list[tuple[str, str]] = []
    sources = [EXAMPLES / example / "README.md", *sorted((EXAMPLES / example).glob("*.toml"))]
    for path in sources:
        if not path.exists():
            continue
        lines = path.read_text().splitlines()
        if path.suffix == ".toml":  # the header: comment lines before the first table
            header = []
            for line in lines:
                if line.startswith("["):
                    break
                header.append(line.lstrip("#"))
            lines = header
        joined: list[str] = []
        for line in lines:
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + line.strip()
            else:
                joined.append(line)
        for line in joined:
            for match in COMMAND.finditer(line):
                command = match.group(1).split("  #")[0].strip()
                found.append((f"{path.relative_to(ROOT)}", command))
    return found


def _run_names(example: str) -> set[str]:
    return {
        tomllib.loads(p.read_text()).get("run", {}).get("name", "")
        for p in (EXAMPLES / example).glob("*.toml")
    }


@pytest.mark.parametrize("example", MINE)
def test_paths_in_documented_commands_exist_from_the_repository_root(example: str):
    commands = _documented_commands(example)
    assert commands, f"no commands found for {example}"  # the reader works
    problems = []
    for where, command in commands:
        try:
            words = shlex.split(command)
        except ValueError:
            continue  # prose with an apostrophe, not a command
        outputs = {words[i + 1] for i, w in enumerate(words[:-1]) if w in OUTPUT_OPTIONS}
        if "calibrate" in words:  # harnessrl data calibrate IN OUT: OUT is written
            positional = [
                w for i, w in enumerate(words) if not w.startswith("-") and words[i - 1] != "--config"
            ]
            outputs |= set(positional[positional.index("calibrate") + 2 :][:1])
        for word in words:
            if word in outputs or word.startswith(("-", "/", "$", "http")) or "=" in word or "/" not in word:
                continue
            if not Path(word).suffix and Path(word).parts[0] not in TOP_FOLDERS:
                continue  # prose ("data calibrate/select/split"), not a path
            parts = Path(word).parts
            if "runs" in parts:  # a run folder the config writes: examples/X/runs/<run.name>
                at = parts.index("runs")
                folder, name = Path(*parts[:at]) if at else Path("."), parts[at + 1 : at + 2]
                if folder != Path("examples", example) or not name or name[0] not in _run_names(example):
                    problems.append(
                        f"{where}: {command!r}: {word} is not a run folder of {example}'s configs"
                    )
                continue
            if not (ROOT / word).exists():
                problems.append(f"{where}: {command!r}: {word} does not exist from the repository root")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("example", MINE)
def test_documented_train_commands_validate_with_their_overrides(example: str):
    from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
    from harnessrl.trainer.config import TrainConfig

    checked = 0
    for where, command in _documented_commands(example):
        try:
            words = shlex.split(command)
        except ValueError:
            continue  # prose with an apostrophe, not a command
        if words[:2] not in (["harnessrl", "train"], [".venv/bin/harnessrl", "train"]):
            continue
        config = next(w for w in words[2:] if not w.startswith("-"))
        overrides = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        overrides = [o for o in overrides if "/path/to/" not in o]  # a placeholder for the user's model
        raw = resolve_relative_paths(load_raw_config(ROOT / config, overrides), (ROOT / config).parent)
        validate_config(TrainConfig, raw, where=where)
        checked += 1
    assert checked, f"no train command found for {example}"


def test_the_lora_config_is_train_toml_with_adapters_only():
    """examples/arithmetic/README.md: "train.toml with [trainer.lora] ... and lr = 5e-5 ... Everything
    else is the same file" (benchmarks/lora_learning.py compares the two as such)."""
    full = _flatten(tomllib.loads((EXAMPLES / "arithmetic" / "train.toml").read_text()))
    lora = _flatten(tomllib.loads((EXAMPLES / "arithmetic" / "train_lora.toml").read_text()))
    differ = {k for k in set(full) | set(lora) if full.get(k) != lora.get(k)}
    allowed = {"run.name", "optimizer.lr"}
    assert {k for k in differ if not k.startswith("trainer.lora.")} <= allowed, sorted(differ)
    assert {"trainer.lora.r", "trainer.lora.alpha", "optimizer.lr"} <= differ  # control: it is LoRA


def test_the_expert_server_answers_bad_requests_in_openais_error_shape():
    """examples/expert_server.py (the examples' scripted teachers): a request whose messages are not
    objects, an empty conversation or a non-object ``stream_options`` is a 400 in OpenAI's error
    shape, and an expert that cannot answer a conversation a 500 in that shape, not a plain-text
    "Internal Server Error" from inside the expert."""
    import importlib.util

    import httpx

    from harnessrl.gateway.server import serve_in_thread

    spec = importlib.util.spec_from_file_location("expert_server", EXAMPLES / "expert_server.py")
    expert_server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(expert_server)

    def answer(messages: list[dict]) -> dict:
        text = expert_server.text_of(messages[-1].get("content"))
        if text == "boom":
            raise ValueError("no answer for this")
        return {"role": "assistant", "content": f"echo: {text}"}

    user = {"role": "user", "content": "hi"}
    server = expert_server.create_server(answer, "expert")
    with serve_in_thread(server) as url, httpx.Client(base_url=f"{url}/v1", timeout=60) as client:
        ok = client.post("/chat/completions", json={"model": "m", "messages": [user]})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "echo: hi"
        for body in (
            {"model": "m", "messages": ["hi"]},
            {"model": "m", "messages": []},
            {"model": "m", "messages": [user], "stream": True, "stream_options": "yes"},
        ):
            bad = client.post("/chat/completions", json=body)
            assert bad.status_code == 400, (body, bad.text)
            assert bad.json()["error"]["type"] == "invalid_request_error", bad.text
        failed = client.post(
            "/chat/completions", json={"model": "m", "messages": [{**user, "content": "boom"}]}
        )
        assert failed.status_code == 500 and failed.headers["content-type"] == "application/json"
        assert failed.json()["error"]["type"] == "server_error" and "no answer for this" in failed.text
