"""Teacher mode: a rollout's calls answered by an upstream OpenAI-compatible chat endpoint, recorded.

Instead of the policy, an upstream chat-completions endpoint (``engine.teacher``) answers the
harness's calls in every API the gateway speaks: ``chat`` passes chat calls through as they are;
``messages`` (Anthropic Messages: Claude Code) and ``responses`` (OpenAI Responses: Codex) translate
the request to chat with the same converters the policy path uses and the upstream's answer back to
their own shapes and event sequences. One OpenAI-compatible teacher (vLLM, a hosted API, another
harnessrl gateway) therefore serves every harness, and every call is recorded as the policy path
records it (``recording.record``): what ``harnessrl sft`` reads (``response_items`` builds the
Responses output). With ``engine.teacher.api = "native"``, ``native`` forwards Messages and
Responses calls to the upstream's own routes instead (Anthropic's or OpenAI's API). ``upstream``
holds the upstream, its key (never shown anywhere) and the error mapping. ``/v1/completions`` is not
served in teacher mode.
"""

from __future__ import annotations

from harnessrl.gateway.teacher.chat import teacher_chat
from harnessrl.gateway.teacher.upstream import Teacher

__all__ = ["Teacher", "teacher_chat"]
