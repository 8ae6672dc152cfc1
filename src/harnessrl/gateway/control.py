"""The control API under ``/api`` (admin key), plus ``/api/health`` (open) and ``/metrics`` (admin).

Used by the controller (create rollouts, hand harnesses their base URL and key, finish them with a
reward) and the trainer (read calls with token IDs, pause for a weight update, resume).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from harnessrl.errors import BadRequest, NotFound, UpstreamError
from harnessrl.gateway.auth import require_admin
from harnessrl.gateway.bodies import CreateRolloutRequest, FinishRolloutRequest, read_json, validate_body
from harnessrl.gateway.cluster import aggregate, parse_order, parse_scope
from harnessrl.gateway.gating import gateway_state_json, pause_gateways, resume_gateways
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Rollout, RolloutStatus


def _admin_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    require_admin(request, state)
    return state


def rollout_json(state: GatewayState, request: Request, rollout: Rollout) -> dict[str, Any]:
    base = state.public_url(str(request.base_url))
    return {**rollout.model_dump(mode="json"), "base_url": f"{base}/rollouts/{rollout.rollout_id}/v1"}


def _query_int(request: Request, name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name!r} must be an integer", param=name) from None
    if value < minimum:
        raise BadRequest(f"query parameter {name!r} must be >= {minimum}", param=name)
    return value


async def health(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    body: dict[str, Any] = {
        "status": "ok" if state.ready else "starting",
        "model": state.engine.model_name,
        "policy_version": state.engine.policy_version,
        "context_length": state.engine.context_length,
        "paused": state.gate.paused,
    }
    if not state.ready:
        return JSONResponse(body, status_code=503)
    try:
        body["engine"] = await state.engine.health()
    except UpstreamError as exc:
        return JSONResponse({**body, "status": "unhealthy", "error": str(exc)}, status_code=503)
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
    return JSONResponse(rollout_json(state, request, rollout), status_code=200 if existed else 201)


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
            run_id=request.query_params.get("run_id"),
            status=statuses,
            group_id=request.query_params.get("group"),
            step=_query_int(request, "step", None),
            limit=_query_int(request, "limit", 100, minimum=1),
            offset=_query_int(request, "offset", 0) or 0,
        )
    )
    return JSONResponse([rollout_json(state, request, r) for r in rollouts])


async def get_rollout(request: Request) -> Response:
    state = _admin_state(request)
    rollout = await state.in_thread(state.store.get_rollout, request.path_params["rollout_id"])
    return JSONResponse(rollout_json(state, request, rollout))


async def list_calls(request: Request) -> Response:
    state = _admin_state(request)
    rollout_id = request.path_params["rollout_id"]
    attempt = _query_int(request, "attempt", None)
    await state.in_thread(state.store.get_rollout, rollout_id)  # 404 for an unknown rollout
    calls = await state.in_thread(lambda: state.store.list_calls(rollout_id, attempt=attempt))
    return JSONResponse([c.model_dump(mode="json") for c in calls])


async def finish_rollout(request: Request) -> Response:
    state = _admin_state(request)
    rollout_id = request.path_params["rollout_id"]
    body = validate_body(FinishRolloutRequest, await read_json(request, state.config.max_body_bytes))
    rollout = await state.in_thread(
        lambda: state.store.finish_rollout(
            rollout_id, body.outcome, body.reward, error=body.error, metadata=body.metadata
        )
    )
    state.history.forget(rollout_id)
    return JSONResponse(rollout_json(state, request, rollout))


async def cancel_rollout(request: Request) -> Response:
    state = _admin_state(request)
    rollout_id = request.path_params["rollout_id"]
    rollout = await state.in_thread(state.store.cancel_rollout, rollout_id)
    state.history.forget(rollout_id)
    return JSONResponse(rollout_json(state, request, rollout))


def _pause_timeout(request: Request, state: GatewayState) -> float:
    raw = request.query_params.get("timeout")
    if raw is None:
        return state.config.pause_timeout_s
    try:
        timeout = float(raw)
    except ValueError:
        raise BadRequest("query parameter 'timeout' must be a number of seconds", param="timeout") from None
    if not timeout >= 0:
        raise BadRequest("query parameter 'timeout' must be >= 0", param="timeout")
    return timeout


async def pause(request: Request) -> Response:
    """Pause this gateway and its peers (``gateway.cluster``); answer once all drained or timed out."""
    state = _admin_state(request)
    timeout = _pause_timeout(request, state)
    scope = parse_scope(request.query_params.get("scope"))
    order = parse_order(request.query_params.get("order"))
    return JSONResponse(await pause_gateways(state, timeout, scope=scope, order=order))


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
    if version < 0:
        raise BadRequest("query parameter 'policy_version' must be >= 0", param="policy_version")
    return version


async def resume(request: Request) -> Response:
    """Resume this gateway and its peers, unless a newer pause is in force (then ``superseded``)."""
    state = _admin_state(request)
    scope = parse_scope(request.query_params.get("scope"))
    order = parse_order(request.query_params.get("order"))
    version = _policy_version(request)
    answer = await resume_gateways(state, scope=scope, order=order, policy_version=version)
    return JSONResponse(answer)


async def get_state(request: Request) -> Response:
    state = _admin_state(request)
    scope = parse_scope(request.query_params.get("scope"))
    peers = await state.cluster.forward("GET", "/api/state", scope, None, None)
    return JSONResponse(aggregate(gateway_state_json(state), peers))


async def metrics(request: Request) -> Response:
    state = _admin_state(request)
    state.refresh_gauges()
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
