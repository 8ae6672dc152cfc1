"""The error hierarchy. Domain code raises these; each edge (HTTP, CLI) translates them in one place.

The gateway maps each class to an HTTP status and the provider's error shape; the CLI prints the
message and exits non-zero. Nothing below the edges raises HTTP exceptions.
"""

from __future__ import annotations


class HarnessRLError(Exception):
    """Root of every error harnessrl raises on purpose."""

    #: HTTP status the gateway answers with when this error reaches it.
    http_status = 500
    #: OpenAI-style error ``type``.
    error_type = "server_error"
    #: Short machine-readable ``code``.
    code = "internal_error"


class BadRequest(HarnessRLError):
    """The client sent something invalid (malformed JSON, a missing or wrong field)."""

    http_status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


class ContextLengthExceeded(BadRequest):
    code = "context_length_exceeded"


class PayloadTooLarge(BadRequest):
    http_status = 413
    code = "payload_too_large"


class Unauthorized(HarnessRLError):
    http_status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(HarnessRLError):
    http_status = 403
    error_type = "permission_error"
    code = "forbidden"


class NotFound(HarnessRLError):
    http_status = 404
    error_type = "not_found_error"
    code = "not_found"


class Conflict(HarnessRLError):
    """The request is well-formed but the resource's state forbids it (e.g. a finished rollout)."""

    http_status = 409
    error_type = "invalid_request_error"
    code = "conflict"


class InvalidTransition(Conflict):
    """A rollout was asked to move between lifecycle states the transition table does not allow."""

    code = "invalid_transition"


class UpstreamError(HarnessRLError):
    """An engine or other dependency failed; not the client's fault."""

    http_status = 502
    error_type = "api_error"
    code = "upstream_error"


class Overloaded(HarnessRLError):
    http_status = 429
    error_type = "rate_limit_error"
    code = "overloaded"


class ConfigError(HarnessRLError):
    """A configuration value is missing or invalid. The message names the field."""

    code = "bad_config"
