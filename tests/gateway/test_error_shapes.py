"""The gateway's one table from error class to HTTP status, OpenAI ``type`` and ``code``
(``gateway.errors.ERROR_SHAPES``): every class answers as it did when the classes carried those
attributes themselves, subclasses inherit their base's row, and domain errors map where they must."""

from __future__ import annotations

import pytest

from harnessrl.engines.remote import AbortedByEngine, RemoteEngineError
from harnessrl.errors import (
    BadRequest,
    ConfigError,
    Conflict,
    ContextLengthExceeded,
    EmptyBatch,
    Forbidden,
    GenerationAborted,
    HarnessRLError,
    InvalidBatch,
    InvalidGenerationRequest,
    InvalidSampleFile,
    InvalidTransition,
    InvalidWeightUpdate,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    UpstreamError,
)
from harnessrl.gateway.errors import (
    ERROR_SHAPES,
    ErrorShape,
    HTTPStatusError,
    MethodNotAllowed,
    RolloutClosed,
    anthropic_error_body,
    error_body,
    error_shape,
)

# What each class's http_status / error_type / code attributes said before the table existed.
BEFORE = [
    (HarnessRLError("x"), 500, "server_error", "internal_error"),
    (BadRequest("x"), 400, "invalid_request_error", "invalid_request"),
    (ContextLengthExceeded("x"), 400, "invalid_request_error", "context_length_exceeded"),
    (PayloadTooLarge("x"), 413, "invalid_request_error", "payload_too_large"),
    (Unauthorized("x"), 401, "authentication_error", "invalid_api_key"),
    (Forbidden("x"), 403, "permission_error", "forbidden"),
    (NotFound("x"), 404, "not_found_error", "not_found"),
    (MethodNotAllowed("x"), 405, "invalid_request_error", "method_not_allowed"),
    (Conflict("x"), 409, "invalid_request_error", "conflict"),
    (InvalidTransition("x"), 409, "invalid_request_error", "invalid_transition"),
    (RolloutClosed("x"), 409, "invalid_request_error", "rollout_closed"),
    (Overloaded("x"), 429, "rate_limit_error", "overloaded"),
    (UpstreamError("x"), 502, "api_error", "upstream_error"),
    (RemoteEngineError("x", retryable=True, status=500), 502, "api_error", "upstream_error"),
    (AbortedByEngine("x"), 503, "api_error", "engine_aborted"),
    (ConfigError("x"), 500, "server_error", "bad_config"),
]


@pytest.mark.parametrize(("exc", "status", "kind", "code"), BEFORE, ids=lambda v: type(v).__name__)
def test_each_class_answers_as_before(exc: HarnessRLError, status: int, kind: str, code: str) -> None:
    assert error_shape(exc) == ErrorShape(status, kind, code)
    body = error_body(exc)["error"]
    assert (body["type"], body["code"], body["message"]) == (kind, code, "x")


def test_domain_errors_carry_no_http_attributes() -> None:
    for cls in ERROR_SHAPES:
        for attr in ("http_status", "error_type", "code"):
            assert not hasattr(cls, attr), f"{cls.__name__}.{attr}: the gateway's table says that"


def test_rl_math_errors_are_server_errors() -> None:
    """Bad samples or a bad batch are harnessrl's own fault, never the client's: a 500 if one
    ever reaches the gateway (e.g. a dashboard page reading a rollout's samples)."""
    for exc in (InvalidBatch("x"), EmptyBatch("x"), InvalidSampleFile("x"), InvalidWeightUpdate("x")):
        assert error_shape(exc) == ErrorShape(500, "server_error", "internal_error")
    assert issubclass(EmptyBatch, InvalidBatch)


def test_an_engine_refusing_the_clients_prompt_is_a_400() -> None:
    assert error_shape(InvalidGenerationRequest("the prompt is empty")).status == 400
    assert error_shape(GenerationAborted("cut short")).status == 503


def test_a_subclass_without_a_row_answers_as_its_base() -> None:
    class StillNotFound(NotFound):
        pass

    assert error_shape(StillNotFound("x")) == ERROR_SHAPES[NotFound]


def test_starlette_statuses_without_a_class_keep_their_status() -> None:
    shape = error_shape(HTTPStatusError("unsupported media", status=415))
    assert shape == ErrorShape(415, "invalid_request_error", "invalid_request")


def test_param_stays_on_the_exception() -> None:
    assert error_body(BadRequest("bad role", param="messages.0.role"))["error"]["param"] == "messages.0.role"
    assert error_body(InvalidBatch("x"))["error"]["param"] is None


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (BadRequest("x"), "invalid_request_error"),
        (Unauthorized("x"), "authentication_error"),
        (PayloadTooLarge("x"), "request_too_large"),
        (Overloaded("x"), "rate_limit_error"),
        (AbortedByEngine("x"), "overloaded_error"),
        (UpstreamError("x"), "api_error"),
        (RolloutClosed("x"), "invalid_request_error"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_anthropic_type_follows_the_mapped_status(exc: HarnessRLError, kind: str) -> None:
    assert anthropic_error_body(exc) == {"type": "error", "error": {"type": kind, "message": "x"}}
