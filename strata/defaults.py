"""Defaults that help texts show, in one module light enough for `strata --help`.

`strata --help` and `strata CMD --help` must print without importing torch, numpy, gguf or the
native library, yet state the real defaults. The modules that apply these values import them
from here, so a help text and the code cannot disagree.

The far left of the layering, beside `units` and `errors`: it must not import anything.
"""
from __future__ import annotations

#: Prefetch depth when none is asked for, per device type (strata.memory.budget says why the CPU's is 0).
DEFAULT_PREFETCH_DEPTH = {"cpu": 0, "cuda": 2}
#: Tokens one engine step processes at most (running decodes plus chunks of prompts).
MAX_STEP_TOKENS = 512
#: KV-cache positions per sequence when n_ctx is not given (capped by the model's).
DEFAULT_CTX = 4096
#: Positions per KV-cache block.
KV_BLOCK_SIZE = 16
#: Share of available memory the CPU device tier takes by default.
DEFAULT_CPU_DEVICE_FRACTION = 0.25
#: Share of available memory the host tier takes by default when the device cannot hold every expert.
DEFAULT_HOST_FRACTION = 0.25

__all__ = ["DEFAULT_CPU_DEVICE_FRACTION", "DEFAULT_CTX", "DEFAULT_HOST_FRACTION", "DEFAULT_PREFETCH_DEPTH",
           "KV_BLOCK_SIZE", "MAX_STEP_TOKENS"]
