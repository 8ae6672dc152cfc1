"""The control API under ``/api`` (admin key), plus ``/api/health`` (open) and ``/metrics`` (admin).

Used by the controller (create rollouts, hand harnesses their base URL and key, finish them with a
reward) and the trainer (read calls with token IDs, pause for a weight update, resume).

Inputs are checked like the model API's (``gateway.json_input``, ``gateway.bodies``), against the
strict bodies below: integers in query parameters within the store's 64-bit range, a finite pause
timeout, no NUL in text the store compares. Records are served by ``records.stored_json``, which shows a
value JSON cannot carry (stored before the boundary was strict) as a placeholder instead of failing
the read.
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Any
from urllib.parse import quote

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from harnessrl.errors import BadRequest, Conflict, NotFound, UpstreamError
from harnessrl.gateway.auth import is_admin_request, require_admin
from harnessrl.gateway.bodies import read_json, validate_body
from harnessrl.gateway.body_models import Lenient
from harnessrl.gateway.control.gating import cluster_state_json, pause_gateways, resume_gateways
from harnessrl.gateway.control.records import stored_json
from harnessrl.gateway.json_input import INT64_MAX
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Call, Outcome, Rollout, RolloutStatus, SamplingOverrides
from harnessrl.store.damage import DAMAGED_ROW, CallsUnreadable, RolloutUnreadable, read_attempt_calls

# -- bodies (ours, so strict) ----------------------------------------------------------------------

#: Text stored in its own column: PostgreSQL's TEXT cannot hold NUL.
StoreText = Annotated[str, Field(pattern=r"^[^\x00]*$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RolloutMetadataIn(Lenient):
    """A new rollout's free-form metadata; only ``sampling`` has a shape (checked here, so a bad
    value is a 400 now instead of a failure of every later call of the rollout)."""

    sampling: SamplingOverrides | None = None


def _not_a_dot_segment(rollout_id: str) -> str:
    """The id is one path segment of every URL that names the rollout (``/api/rollouts/ID``, its
    ``base_url``) and a folder of its run (``rollouts/ID``): ``.`` and ``..`` are no segment there
    (clients collapse them: ``..`` reached ``/api``), so such a rollout could be neither read nor
    finished, and its logs went to the run folder itself."""
    if rollout_id in (".", ".."):
        raise ValueError("a rollout id may not be '.' or '..'")
    return rollout_id


RolloutId = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$"),
    AfterValidator(_not_a_dot_segment),
]


class CreateRolloutRequest(Strict):
    task: dict[str, Any] = Field(default_factory=dict)
    rollout_id: RolloutId | None = None
    group: StoreText | None = None
    run_id: StoreText | None = None
    task_id: StoreText | None = None
    step: int | None = Field(default=None, ge=0, le=INT64_MAX)
    metadata: RolloutMetadataIn = Field(default_factory=RolloutMetadataIn)


class FinishRolloutRequest(Strict):
    outcome: Outcome
    reward: float = Field(allow_inf_nan=False)  # a reward of inf/NaN poisons every advantage of its group
    error: StoreText | None = None
    metadata: dict[str, Any] | None = None


# -- routes ------------------------------------------------------------------------------------------


def _admin_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    require_admin(request, state)
    return state


#: Seconds a pause may wait for the drain; a longer one is surely a mistake (``timeout=1e308``).
MAX_PAUSE_TIMEOUT_S = 86_400.0


def rollout_json(state: GatewayState, request: Request, rollout: Rollout) -> dict[str, Any]:
    base = state.public_url(str(request.base_url))
    # The id as one path segment: a run's name (the ids' prefix) may hold ``#``, ``?``, ``%`` or a space.
    segment = quote(rollout.rollout_id, safe="")
    return {**rollout.model_dump(mode="json"), "base_url": f"{base}/rollouts/{segment}/v1"}


def _query_int(request: Request, name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name!r} must be an integer", param=name) from None
    if not minimum <= value <= INT64_MAX:
        raise BadRequest(f"query parameter {name!r} must be in {minimum}..{INT64_MAX}", param=name)
    return value


def _query_text(request: Request, name: str) -> str | None:
    raw = request.query_params.get(name)
    if raw is not None and "\x00" in raw:
        raise BadRequest(f"query parameter {name!r} must not contain NUL", param=name)
    return raw


def _rollout_id(request: Request) -> str:
    rollout_id: str = request.path_params["rollout_id"]
    if "\x00" in rollout_id:  # no rollout id holds NUL, and PostgreSQL cannot even compare one
        raise NotFound(f"rollout {rollout_id!r} not found")
    return rollout_id


async def health(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    body: dict[str, Any] = {
        "status": "ok" if state.ready else "starting",
        "model": state.engine.model_name,
        "policy_version": state.engine.policy_version,
        "context_length": state.engine.context_length,
        "paused": state.gate.paused,
        "formats": {
            "tool_call_parser": state.formats.tool_parser,
            "reasoning_parser": state.formats.reasoning_parser,
            "chosen_by": state.formats.source,
        },
    }
    if not state.ready:
        return JSONResponse(body, status_code=503)
    # The route is open (a harness in its sandbox reaches it too), but the engine's own status names
    # the inference servers (a vLLM URL, a pool's replicas, an error quoting one): the admin only.
    admin = is_admin_request(request, state)
    try:
        engine = await state.engine.health()
    except UpstreamError as exc:
        error = str(exc) if admin else "the engine is unhealthy (the admin key shows why)"
        return JSONResponse({**body, "status": "unhealthy", "error": error}, status_code=503)
    if admin:
        body["engine"] = engine
    return JSONResponse(body)


async def create_rollout(request: Request) -> Response:
    state = _admin_state(request)
    body = validate_body(CreateRolloutRequest, await read_json(request, state.config.max_body_bytes))
    existed = False
    if body.rollout_id is not None:
        try:
            await state.in_thread(state.store.get_rollout, body.rollout_id)
            existed = True
        except NotFound:
            pass
    rollout = await state.in_thread(
        lambda: state.store.create_rollout(
            rollout_id=body.rollout_id,
            task=body.task,
            run_id=body.run_id,
            task_id=body.task_id,
            group_id=body.group,
            step=body.step,
            metadata=body.metadata.model_dump(exclude_unset=True),
        )
    )
    return stored_json(rollout_json(state, request, rollout), status_code=200 if existed else 201)


async def list_rollouts(request: Request) -> Response:
    state = _admin_state(request)
    status = request.query_params.get("status")
    statuses = None
    if status:
        try:
            statuses = [RolloutStatus(s) for s in status.split(",")]
        except ValueError:
            known = ", ".join(s.value for s in RolloutStatus)
            raise BadRequest(f"unknown status in {status!r} (known: {known})", param="status") from None
    rollouts = await state.in_thread(
        lambda: state.store.list_rollouts(
            run_id=_query_text(request, "run_id"),
            status=statuses,
            group_id=_query_text(request, "group"),
            step=_query_int(request, "step", None),
            limit=_query_int(request, "limit", 100, minimum=1),
            offset=_query_int(request, "offset", 0) or 0,
        )
    )
    return stored_json([rollout_json(state, request, r) for r in rollouts])


async def get_rollout(request: Request) -> Response:
    state = _admin_state(request)
    rollout = await state.in_thread(state.store.get_rollout, _rollout_id(request))
    return stored_json(rollout_json(state, request, rollout))


async def list_calls(request: Request) -> Response:
    """The rollout's calls (``?attempt=N``: that attempt's). A damaged record is a 409 naming it
    (``CallsUnreadable``): the rollout, the attempt and the column; the other attempts are still
    read one by one. A rollout whose own row is damaged still has its calls served."""
    state = _admin_state(request)
    rollout_id = _rollout_id(request)
    attempt = _query_int(request, "attempt", None)
    rollout: Rollout | None = None
    with contextlib.suppress(RolloutUnreadable):  # its row is damaged; its calls are rows of their own
        rollout = await state.in_thread(state.store.get_rollout, rollout_id)  # 404 for an unknown rollout
    if attempt is not None:
        calls = await state.in_thread(read_attempt_calls, state.store, rollout_id, attempt)
    else:
        calls = await state.in_thread(_all_calls, state, rollout_id, rollout)
    return stored_json([c.model_dump(mode="json") for c in calls])


def _all_calls(state: GatewayState, rollout_id: str, rollout: Rollout | None) -> list[Call]:
    """Every call of the rollout; ``CallsUnreadable`` naming each attempt that holds a damaged row."""
    try:
        return state.store.list_calls(rollout_id)
    except UpstreamError:
        raise
    except DAMAGED_ROW as exc:
        damaged = []
        for attempt in range(rollout.attempt + 1 if rollout is not None else 0):
            try:
                read_attempt_calls(state.store, rollout_id, attempt)
            except CallsUnreadable:
                damaged.append(str(attempt))
        which = f" of attempt {', '.join(damaged)}" if damaged else ""
        raise CallsUnreadable(
            f"rollout {rollout_id}: the recorded calls{which} cannot be read (a damaged row): "
            f"{type(exc).__name__}: {exc}; the other attempts read with ?attempt=N"
        ) from exc


async def finish_rollout(request: Request) -> Response:
    state = _admin_state(request)
    rollout_id = _rollout_id(request)
    body = validate_body(FinishRolloutRequest, await read_json(request, state.config.max_body_bytes))
    try:
        rollout = await state.in_thread(
            lambda: state.store.finish_rollout(
                rollout_id, body.outcome, body.reward, error=body.error, metadata=body.metadata
            )
        )
    except RolloutUnreadable as exc:
        # No verdict fits in a row that cannot be read (the finish merges into its metadata and
        # returns it). It ends failed (infra_failure) instead, as the controller ends one, or an
        # external controller finishing through this API could never end it: it stayed running.
        raise await _end_unreadable(state, rollout_id, exc, "this finish") from exc
    state.history.forget(rollout_id)
    return stored_json(rollout_json(state, request, rollout))


async def cancel_rollout(request: Request) -> Response:
    state = _admin_state(request)
    rollout_id = _rollout_id(request)
    try:
        rollout = await state.in_thread(state.store.cancel_rollout, rollout_id)
    except RolloutUnreadable as exc:  # as a finish: the one end such a row can take
        raise await _end_unreadable(state, rollout_id, exc, "a cancel") from exc
    state.history.forget(rollout_id)
    return stored_json(rollout_json(state, request, rollout))


async def _end_unreadable(
    state: GatewayState, rollout_id: str, exc: RolloutUnreadable, what: str
) -> Conflict:
    """End a rollout whose row cannot be read ``failed`` (``infra_failure``; the store's
    ``fail_unreadable_rollout``): the 409 to answer, saying whether it did."""
    ended = await state.in_thread(lambda: state.store.fail_unreadable_rollout(rollout_id))
    state.history.forget(rollout_id)
    instead = "it ended failed (infra_failure) instead" if ended else "nothing was written"
    return Conflict(f"{exc}; {what} cannot be recorded in it: {instead}")


def _pause_timeout(request: Request, state: GatewayState) -> float:
    raw = request.query_params.get("timeout")
    if raw is None:
        return state.config.pause_timeout_s
    try:
        timeout = float(raw)
    except ValueError:
        raise BadRequest("query parameter 'timeout' must be a number of seconds", param="timeout") from None
    if not 0 <= timeout <= MAX_PAUSE_TIMEOUT_S:  # NaN fails both
        raise BadRequest(
            f"query parameter 'timeout' must be a finite number of seconds in 0..{MAX_PAUSE_TIMEOUT_S:.0f}",
            param="timeout",
        )
    return timeout


async def pause(request: Request) -> Response:
    """Pause every gateway sharing the store (``gateway.control.cluster``); answer once all drained or timed out."""
    state = _admin_state(request)
    timeout = _pause_timeout(request, state)
    return JSONResponse(await pause_gateways(state, timeout))


def _policy_version(request: Request) -> int | None:
    raw = request.query_params.get("policy_version")
    if raw is None:
        return None
    try:
        version = int(raw)
    except ValueError:
        raise BadRequest(
            "query parameter 'policy_version' must be an integer", param="policy_version"
        ) from None
    return version  # its range and that it does not go backwards: ``resume_gateways``


async def resume(request: Request) -> Response:
    """Resume every gateway sharing the store, optionally publishing a policy version."""
    state = _admin_state(request)
    version = _policy_version(request)
    rewind = request.query_params.get("rewind", "false").lower()
    if rewind not in ("true", "false", "1", "0"):
        raise BadRequest("query parameter 'rewind' must be true or false", param="rewind")
    answer = await resume_gateways(state, policy_version=version, rewind=rewind in ("true", "1"))
    return JSONResponse(answer)


async def get_state(request: Request) -> Response:
    state = _admin_state(request)
    return JSONResponse(await cluster_state_json(state))


async def metrics(request: Request) -> Response:
    state = _admin_state(request)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
