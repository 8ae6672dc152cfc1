"""Inference engines behind the gateway. Import concrete engines from their modules: the embedded
engine needs torch, the rest must not."""

from harnessrl.engines.base import (
    Engine,
    GenerationContext,
    Samples,
    SamplingParams,
    TokenSample,
    WeightUpdate,
)

__all__ = ["Engine", "GenerationContext", "Samples", "SamplingParams", "TokenSample", "WeightUpdate"]
