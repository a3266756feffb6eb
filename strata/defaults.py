"""Defaults that help texts show, in one module light enough for `strata --help`.

`strata --help` and `strata CMD --help` must print without importing torch, numpy, gguf or the
native library, yet state the real defaults. The modules that apply these values (SamplingParams,
the pager, the memory budgets, the converter's type policy) import them from here, so a help
text and the code cannot disagree.

The far left of the layering, beside `units` and `errors`: it must not import anything.
"""
from __future__ import annotations

#: Sampling of the commands that write text for people (`generate`, `chat`), of `serve` for the
#: fields a request omits, and of the API (SamplingParams' field defaults). The rule: where
#: llama.cpp (common.h: temp 0.80, top_k 40, top_p 0.95, min_p 0.05, repeat 1.00) and Ollama
#: (temperature 0.8, top_k 40, top_p 0.9, min_p 0, repeat 1.1) agree, their value; where they
#: differ, the filter is off. Temperature 0 (`--temperature 0`) is greedy.
SAMPLING_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
                     "max_tokens": 256}

#: Worker threads of a pager when the caller does not say (the host tier's default too).
DEFAULT_PAGER_THREADS = 4
#: Most compute threads (--threads): the native compute pool's POOL_MAX_THREADS (native/runtime/pool.c).
MAX_THREADS = 256
#: Policy margin of decoding and of the trace replay (strata.memory.budget explains them).
DEFAULT_PREFETCH_MARGIN = 2.0
REPLAY_PREFETCH_MARGIN = 8.0

#: The converter's tensor types (`strata convert`): the choices and the defaults of --attn/--experts.
CONVERT_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_k", "q6_k", "mxfp4")
CONVERT_OUTTYPES = ("f32", "f16", "bf16", "q8_0")
DEFAULT_ATTN_TYPE = "q8_0"
DEFAULT_EXPERTS_TYPE = "q4_k"

#: Prefetch depth when none is asked for, per device type (strata.memory.budget says why the CPU's is 0).
DEFAULT_PREFETCH_DEPTH = {"cpu": 0, "cuda": 2}
#: Tokens one engine step processes at most (running decodes plus chunks of prompts): llama-server's
#: --batch-size and vLLM's max_num_batched_tokens. Prompts that arrive close together are prefilled
#: in one step, up to this many tokens, and start streaming together.
MAX_STEP_TOKENS = 2048
#: `strata serve --gather-ms`: how long a request that wakes an idle server waits at most for the
#: requests still on their way, so a burst's prompts are prefilled in one step and decode in step.
SERVE_GATHER_MS = 50
#: KV-cache positions per sequence when n_ctx is not given (capped by the model's).
DEFAULT_CTX = 4096
#: Positions per KV-cache block.
KV_BLOCK_SIZE = 16
#: The prefix cache's room beyond the running sequences' KV blocks under `--cache-ram auto` (the
#: server's default): llama-server's default prompt cache (`--cache-ram 8192` MiB), at most
#: CACHE_RAM_SHARE of the RAM available at start.
DEFAULT_CACHE_RAM = 8 << 30
CACHE_RAM_SHARE = 1 / 8
#: The KV cache's element types (`--kv-type`): floats, or Q8_0 blocks as llama.cpp's
#: `--cache-type-k/v q8_0`. None (the default): the compute dtype, float32 on the CPU.
KV_TYPES = ("f32", "f16", "bf16", "q8_0")
DEFAULT_KV_TYPE = None
#: Share of available memory the CPU device tier takes by default.
DEFAULT_CPU_DEVICE_FRACTION = 0.25
#: Share of available memory the host tier takes by default when the device cannot hold every expert.
DEFAULT_HOST_FRACTION = 0.25

__all__ = ["CONVERT_OUTTYPES", "CONVERT_TYPES", "DEFAULT_ATTN_TYPE", "DEFAULT_CPU_DEVICE_FRACTION", "DEFAULT_CTX",
           "DEFAULT_EXPERTS_TYPE", "DEFAULT_HOST_FRACTION", "DEFAULT_PAGER_THREADS", "DEFAULT_PREFETCH_DEPTH",
           "DEFAULT_PREFETCH_MARGIN", "DEFAULT_KV_TYPE", "DEFAULT_CACHE_RAM", "CACHE_RAM_SHARE", "KV_BLOCK_SIZE", "KV_TYPES", "MAX_STEP_TOKENS", "REPLAY_PREFETCH_MARGIN", "SAMPLING_DEFAULTS"]
