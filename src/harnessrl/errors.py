"""The error hierarchy. Domain code raises these; each edge (HTTP, CLI) translates them in one place.

A class names what happened (``EmptyBatch``, ``InvalidTransition``, ``UpstreamError``) and carries
no HTTP status. The gateway maps each class to a status and the provider's error shape
(``gateway.errors.ERROR_SHAPES``); the CLI prints the message and exits non-zero. Nothing below the
edges raises HTTP exceptions.

Two families:

- what a *client* of the gateway got wrong or may not do (``BadRequest``, ``NotFound``,
  ``Conflict``, ``Unauthorized``, ``Forbidden``, ``Overloaded``...): raised while serving a request;
- what went wrong *inside* harnessrl (``InvalidBatch``, ``InvalidGenerationRequest``,
  ``InvalidWeightUpdate``, ``ConfigError``, ``UpstreamError``...): raised by the RL math, the
  engines and the loaders, whoever called them.
"""

from __future__ import annotations


class HarnessRLError(Exception):
    """Root of every error harnessrl raises on purpose."""


# -- a client's request -----------------------------------------------------------------------------


class BadRequest(HarnessRLError):
    """The client sent something invalid (malformed JSON, a missing or wrong field).

    ``param``: the request field at fault (``messages.0.role``), when one is.
    """

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.param = param


class ContextLengthExceeded(BadRequest):
    """The prompt, or the prompt plus ``max_tokens``, does not fit the engine's context."""


class PayloadTooLarge(BadRequest):
    """The request body is over the gateway's limit."""


class Unauthorized(HarnessRLError):
    """No key, or a key that opens nothing."""


class Forbidden(HarnessRLError):
    """A valid key that does not open this resource (a rollout's key on the control API)."""


class NotFound(HarnessRLError):
    """No such rollout, run, call or route."""


class Conflict(HarnessRLError):
    """The request is well-formed but the resource's state forbids it (e.g. a finished rollout)."""


class InvalidTransition(Conflict):
    """A rollout was asked to move between lifecycle states the transition table does not allow."""


class Overloaded(HarnessRLError):
    """Too much in flight: back off and try again."""


# -- inside harnessrl -------------------------------------------------------------------------------


class UpstreamError(HarnessRLError):
    """An engine or other dependency failed; not the client's fault."""


class GenerationAborted(UpstreamError):
    """The engine ended a generation itself (vLLM's ``finish_reason`` ``abort``): the answer is not
    the policy's and must not be recorded; the same request may be sent again from the prompt."""


class ConfigError(HarnessRLError):
    """A configuration value is missing or invalid. The message names the field."""


class InvalidBatch(HarnessRLError):
    """Calls, samples or rollouts the RL math cannot use: lengths that disagree, a sample without its
    advantage, a rollout or sample given twice, a loss asked for an aggregation its inputs lack."""


class EmptyBatch(InvalidBatch):
    """A (micro-)batch with no samples in it."""


class InvalidSampleFile(HarnessRLError):
    """A samples file (``trajectory.export``) of an unknown type, or a row not in its format."""


class InvalidGenerationRequest(HarnessRLError):
    """An engine was asked for a generation it cannot serve as asked: an empty prompt, token IDs
    outside its vocabulary, ``max_tokens`` below 1."""


class InvalidWeightUpdate(HarnessRLError):
    """A weight update an engine cannot apply: no weights in it, or names the model does not have."""
