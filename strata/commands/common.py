"""Options every model-running command shares, and loading a model from them.
Must not: compute or format library results beyond the shared --stats lines.
"""
from __future__ import annotations

import argparse
import os
import sys

from strata.defaults import (DEFAULT_CPU_DEVICE_FRACTION, DEFAULT_CTX, DEFAULT_HOST_FRACTION, DEFAULT_KV_TYPE,
                             DEFAULT_PREFETCH_DEPTH, KV_BLOCK_SIZE, KV_TYPES, MAX_STEP_TOKENS, MAX_THREADS,
                             SAMPLING_DEFAULTS)
from strata.errors import StrataArgumentError, StrataError
from strata.hub import SPEC_FORM


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, help="GGUF model file (any part of a split one), or -hf")
    add_hf_arg(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", default=None, help="compute dtype: float32, bfloat16, float16 "
                                                 "(default float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--threads", type=int, default=None, help=f"CPU threads, 1 to {MAX_THREADS} (default: all available)")
    p.add_argument("--ctx", type=int, default=None, help=f"context length (default: min(model's, {DEFAULT_CTX}))")
    p.add_argument("--compute", choices=("auto", "packed", "float"), default=None,
                   help="packed: weights stay in their GGUF blocks, native quantized kernels multiply (the CPU "
                        "default); float: weights dequantized into --dtype, torch multiplies (the reference, and "
                        "CUDA's)")
    g = p.add_argument_group("batching and KV cache")
    g.add_argument("--max-step-tokens", type=int, default=None, metavar="N",
                   help="tokens one engine step processes at most: running decodes plus chunks of prompts being "
                        "prefilled; prompts that arrive close together are prefilled in one step up to this many, "
                        f"as llama-server's --batch-size (default {MAX_STEP_TOKENS})")
    g.add_argument("--decoding-step-tokens", type=int, default=None, metavar="N",
                   help="the same while sequences decode, if smaller: the longest pause a prompt being prefilled puts "
                        "in running streams (default: --max-step-tokens)")
    g.add_argument("--kv-blocks", type=int, default=None, metavar="N",
                   help=f"KV cache blocks of {KV_BLOCK_SIZE} positions shared by all sequences (default: enough for every "
                        "sequence of the batch at --ctx)")
    add_kv_type_arg(g)
    p.add_argument("--chat-template-file", default=None, metavar="FILE",
                   help="a jinja2 chat template that replaces the file's tokenizer.chat_template (as llama-server's)")
    add_memory_args(p)


def add_hf_arg(p: argparse.ArgumentParser) -> None:
    """-hf / --hf-repo, in place of the model path (`resolve_model` turns it into one)."""
    p.add_argument("-hf", "--hf-repo", default=None, metavar=SPEC_FORM,
                   help="the model from a Hugging Face hub repository, as llama.cpp's -hf: its GGUF of QUANT (default "
                        "Q4_K_M, else Q8_0, else the first), every part of a split one, downloaded into the hub's "
                        "cache (HF_HOME; HF_TOKEN for private repositories; HF_HUB_OFFLINE=1: the cache only)")


def resolve_model(args: argparse.Namespace, field: str = "model") -> None:
    """Refuse both a model path and -hf, or neither; with -hf, fetch the model (strata.hub) and put
    its local path in `args.<field>`, so the command goes on with a path."""
    spec, path = getattr(args, "hf_repo", None), getattr(args, field)
    if spec is None:
        if path is None:
            raise StrataArgumentError(f"expected a MODEL file or -hf {SPEC_FORM}")
        return
    if path is not None:
        raise StrataArgumentError(f"give a MODEL file or -hf {spec}, not both ({path})")
    from strata.hub import resolve

    setattr(args, field, str(resolve(spec)))
    args.hf_repo = None  # resolved: a second check sees a plain path


def add_kv_type_arg(g) -> None:
    g.add_argument("--kv-type", choices=KV_TYPES, default=DEFAULT_KV_TYPE,
                   help="the KV cache's element type; q8_0: blocks of 32 values in 34 bytes as llama.cpp's "
                        "--cache-type-k/v q8_0, a quarter of f32's bytes (default: "
                        f"{DEFAULT_KV_TYPE or 'the compute dtype, f32 on cpu'})")


def chat_template(args: argparse.Namespace) -> str | None:
    """The text of --chat-template-file, or None; a file that cannot be read is a one-line error."""
    path = getattr(args, "chat_template_file", None)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise StrataError(f"--chat-template-file {path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None


def add_memory_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("expert memory")
    g.add_argument("--memory", choices=("tiered", "paged", "direct"), default=None,
                   help="tiered: device slots, host tier, pager, prefetch (the default on cuda, or with "
                        "--device-mem, --prefetch-depth, --slot-form or --hybrid); paged (cpu, packed compute): one "
                        "pool of RAM slots that misses are read into and computed from, its budget --host-mem; "
                        "direct: read every expert in place from the mapped file. Default on cpu with packed "
                        "compute: direct when the file fits in RAM and is in the page cache (a file just read or "
                        "run), else paged; --stats says which and why")
    g.add_argument("--device-mem", default=None, metavar="SIZE",
                   help="bytes the model may use on the device, resident weights and KV cache included, "
                        f"e.g. 20G (default: free GPU memory less headroom; on cpu {100 * DEFAULT_CPU_DEVICE_FRACTION:g}%% of "
                        "available RAM)")
    g.add_argument("--host-mem", default=None, metavar="SIZE",
                   help=f"bytes of host RAM for packed experts, e.g. 64G (default: {100 * DEFAULT_HOST_FRACTION:g}%% of available "
                        "RAM, or the minimum when the device holds every expert)")
    g.add_argument("--prefetch-depth", type=int, default=None, metavar="D",
                   help="layers ahead whose experts are loaded while a layer computes; 0 = off "
                        f"(default {DEFAULT_PREFETCH_DEPTH['cuda']} on cuda, {DEFAULT_PREFETCH_DEPTH['cpu']} on cpu; 0 "
                        "when the device slots hold every expert)")
    g.add_argument("--miss-stand-in", default=None, metavar="TYPE",
                   help="cpu, paged memory: keep a low-bit copy of every expert in RAM (a ggml type the native "
                        "runtime quantizes and multiplies: q2_k, q4_k, q6_k, q8_0), counted in --host-mem, and "
                        "compute a miss from it instead of waiting for its read (default: off)")
    g.add_argument("--stand-in-mode", choices=("background", "instead"), default=None,
                   help="with --miss-stand-in: background (default) reads a missed expert without waiting "
                        "for it when a slot is free or it is used more often than the expert it would replace "
                        "(the slots follow the hottest experts); instead: only into a free slot")
    g.add_argument("--hybrid", action="store_true", default=None,
                   help="cuda: compute missed experts that host RAM holds on the CPU (native kernels) while the "
                        "GPU runs the others, when measured costs say that beats copying them")
    g.add_argument("--slot-form", choices=("dequantized", "packed"), default=None,
                   help="device slots hold experts dequantized (pure GEMM at use) or packed (3.5-7x more "
                        "experts per byte, dequantized at use); default: dequantized when every expert fits so")
    g.add_argument("--stats", action="store_true",
                   help="print the expert memory's hits, misses, bytes moved and waits after the run")


def add_save_routing_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--save-routing", metavar="FILE.npz", default=None,
                   help="save how often each expert was routed to (arrays counts [L, E] and tokens), for "
                        "python -m strata.convert --routing-stats (needs --memory tiered or paged)")
    p.add_argument("--save-trace", metavar="FILE.npz", default=None,
                   help="save every token's routed experts (an .npz file whose array 'indices' is [layers, tokens, "
                        "top-k]) for strata bench cache --trace (needs --memory tiered or paged)")


def check_save_routing(args: argparse.Namespace) -> None:
    """Refuse --save-routing up front when the run will not count routing."""
    for flag in ("save_routing", "save_trace"):
        if getattr(args, flag, None) and args.memory == "direct":
            raise StrataError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: routing is counted by --memory "
                              f"tiered or paged, not --memory {args.memory}")


def save_routing(args: argparse.Namespace, model) -> None:
    """With --save-routing, the expert memory's routing counts as an .npz file; with --save-trace,
    its per-token trace."""
    save_trace(args, model)
    if not getattr(args, "save_routing", None):
        return
    from strata.gguf.routing import save_routing_npz

    stats = model.memory_stats()
    if stats is None or not hasattr(stats, "routing"):
        raise StrataError(f"--save-routing {args.save_routing}: the model's expert memory counts no routing")
    counts, tokens = stats.routing()
    try:
        save_routing_npz(args.save_routing, counts, tokens)
    except OSError as exc:
        raise StrataError(f"{args.save_routing}: cannot write routing statistics: {exc.strerror or exc}") from None
    print(f"routing statistics of {tokens} tokens saved to {args.save_routing}", file=sys.stderr)


def save_trace(args: argparse.Namespace, model) -> None:
    """With --save-trace, the routing trace recorded since load (`start_trace` in `load_model`)."""
    path = getattr(args, "save_trace", None)
    stats = model.memory_stats() if path else None
    if not path:
        return
    trace = stats.trace() if stats is not None and hasattr(stats, "trace") else None
    if trace is None:
        raise StrataError(f"--save-trace {path}: the model's expert memory records no routing trace")
    import numpy as np

    try:
        np.savez(path, indices=trace, layers=np.asarray(stats.layers, dtype=np.int64))
    except OSError as exc:
        raise StrataError(f"{path}: cannot write the routing trace: {exc.strerror or exc}") from None
    print(f"routing trace of {trace.shape[1]} tokens x {trace.shape[0]} layers saved to {path}", file=sys.stderr)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The sampling flags, their defaults strata.defaults.SAMPLING_DEFAULTS (the rule every command follows)."""
    d = SAMPLING_DEFAULTS
    p.add_argument("-n", "--max-tokens", type=int, default=d["max_tokens"],
                   help=f"tokens to generate at most (default {d['max_tokens']})")
    p.add_argument("--temperature", "--temp", type=float, default=d["temperature"],
                   help=f"0 = greedy (default {d['temperature']:g})")
    p.add_argument("--top-k", type=int, default=d["top_k"],
                   help=f"keep the k most likely tokens (0 = off; default {d['top_k']})")
    p.add_argument("--top-p", type=float, default=d["top_p"],
                   help=f"nucleus sampling threshold (1 = off; default {d['top_p']:g})")
    p.add_argument("--min-p", type=float, default=d["min_p"],
                   help=f"drop tokens below min_p x the top probability (0 = off; default {d['min_p']:g})")
    p.add_argument("--repeat-penalty", type=float, default=d["repetition_penalty"],
                   help=f"repetition penalty (1 = off; default {d['repetition_penalty']:g})")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")


#: The flags of the options `strata.load` and SamplingParams take, by field name: errors name the flag.
FLAGS = {"n_ctx": "--ctx", "threads": "--threads", "max_step_tokens": "--max-step-tokens",
         "decoding_step_tokens": "--decoding-step-tokens", "kv_blocks": "--kv-blocks",
         "memory": "--memory", "device_mem": "--device-mem", "host_mem": "--host-mem",
         "prefetch_depth": "--prefetch-depth", "slot_form": "--slot-form", "hybrid": "--hybrid",
         "miss_stand_in": "--miss-stand-in", "stand_in_mode": "--stand-in-mode",
         "max_tokens": "-n/--max-tokens", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
         "min_p": "--min-p", "repetition_penalty": "--repeat-penalty", "seed": "--seed", "stop": "--stop"}


def sampling_params(args: argparse.Namespace):
    """The SamplingParams of the sampling flags (checked as the API checks them, errors naming the flag)."""
    from strata.engine.sampling import SamplingParams

    extra = {"stop_token_ids": ()} if getattr(args, "ignore_eos", False) else {}  # fixed-length runs (benchmarks)
    return SamplingParams.build(FLAGS, max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repeat_penalty,
                                seed=args.seed, stop=args.stop, **extra)


def memory_config(args: argparse.Namespace):
    """The MemoryConfig of the memory flags (checked as the API checks them, errors naming the flag)."""
    from strata.engine.config import memory_config as build

    options = dict(device_mem=args.device_mem, host_mem=args.host_mem, prefetch_depth=args.prefetch_depth,
                   slot_form=args.slot_form, hybrid=getattr(args, "hybrid", None),
                   miss_stand_in=getattr(args, "miss_stand_in", None), stand_in_mode=getattr(args, "stand_in_mode", None))
    # --save-routing and --save-trace need a memory that counts routing: without --memory, the tiered
    # memory (the paged memory serves it on the CPU with packed compute, whose default may read the
    # experts in place from the mapped file and count nothing)
    counts = getattr(args, "save_routing", None) or getattr(args, "save_trace", None)
    return build(args.memory or ("tiered" if counts else None), options, FLAGS)


def check_model_args(args: argparse.Namespace) -> None:
    """Refuse out-of-range model and memory options by flag name before anything loads."""
    from strata.engine.config import check_engine

    check_engine({"n_ctx": args.ctx, "threads": args.threads, "max_step_tokens": getattr(args, "max_step_tokens", None),
                  "decoding_step_tokens": getattr(args, "decoding_step_tokens", None),
                  "kv_blocks": getattr(args, "kv_blocks", None)}, FLAGS)
    memory_config(args)
    resolve_model(args)  # last: a download follows only flags that passed


def check_sampling_args(args: argparse.Namespace):
    """The flags' SamplingParams; out-of-range sampling options (and an empty prompt) refused by flag name."""
    params = sampling_params(args)
    if getattr(args, "prompt", None) is not None and not args.prompt:
        raise StrataArgumentError("-p/--prompt: expected non-empty text, found ''")
    return params


def add_expert_parallel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("expert parallelism (launch with: torchrun --nproc-per-node N -m strata ...)")
    g.add_argument("--expert-parallel", action="store_true",
                   help="this process is one rank of an expert-parallel group (RANK, WORLD_SIZE, MASTER_ADDR and "
                        "MASTER_PORT from torchrun): it holds a shard of every MoE layer's routed experts; rank 0 prints")
    g.add_argument("--replicate-hot", type=int, default=0, metavar="N",
                   help="hold each layer's N hottest experts (by the file's routing statistics) on every rank")
    g.add_argument("--ep-timeout", type=float, default=None, metavar="S",
                   help="seconds a rank waits for the others during a step before failing (a rank died or hangs; default 60; start-up waits up to 900)")
    g.add_argument("--rank-memory", action="append", default=[], metavar="R:KEY=VALUE[,KEY=VALUE]",
                   help="memory flags for rank R only (a rank number, or a host name: its ranks), e.g. "
                        "1:host-mem=48G,prefetch-depth=2; KEY: memory, device-mem, host-mem, prefetch-depth, slot-form, "
                        "hybrid (on/off), miss-stand-in, stand-in-mode (repeatable; rank overrides win over host ones)")


def expert_parallel(args: argparse.Namespace):
    """This process's `strata.distributed.ExpertParallel` rank (the group joined), or None; its
    --rank-memory overrides set on `args` before it joins."""
    if not getattr(args, "expert_parallel", False):
        if getattr(args, "rank_memory", None):
            raise StrataArgumentError(f"--rank-memory {args.rank_memory[0]!r}: goes with --expert-parallel")
        return None
    from strata.distributed import ExpertParallel
    from strata.distributed.group import DEFAULT_TIMEOUT_S

    if args.replicate_hot < 0 or (args.ep_timeout is not None and args.ep_timeout <= 0):
        raise StrataArgumentError("--replicate-hot and --ep-timeout: expected N >= 0 and S > 0, found "
                                  f"{args.replicate_hot} and {args.ep_timeout}")
    if args.rank_memory:
        from .rank_memory import apply, parse

        for spec in args.rank_memory:  # its syntax first, whatever the environment
            parse(spec)
        if all(k in os.environ for k in ("RANK", "WORLD_SIZE")):  # else from_env says what is missing
            apply(args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    return ExpertParallel.from_env(args.replicate_hot, args.ep_timeout or DEFAULT_TIMEOUT_S)


def follow_rank(ep, loader) -> int:
    """A rank other than 0 under a leader (serve, bench): loads the model as rank 0 does (`loader()`),
    runs rank 0's forward passes until it stops, prints nothing (errors excepted)."""
    import contextlib

    from strata.distributed.lockstep import follow

    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        with loader() as model:
            follow(model, ep)
    return 0


def load_model(args: argparse.Namespace, max_batch: int = 1, ep=None):
    import strata

    check_model_args(args)
    sampling = check_sampling_args(args) if hasattr(args, "max_tokens") else None
    check_save_routing(args)
    model = strata.load(args.model, max_batch=max_batch, sampling=sampling, expert_parallel=ep, **load_kwargs(args))
    stats = model.memory_stats() if getattr(args, "save_trace", None) or getattr(args, "stats", False) else None
    if stats is not None and hasattr(stats, "start_trace"):
        from strata.bench.cache import disk_tier

        # --save-trace writes it; --stats replays it through Belady's policy from this residency
        stats.start_trace(disk_tier(model.memory))
    return model


def load_kwargs(args: argparse.Namespace) -> dict:
    """`strata.load`'s keyword arguments from the shared model and memory options."""
    engine = {k: getattr(args, k) for k in ("max_step_tokens", "decoding_step_tokens", "kv_blocks", "kv_type", "cache_ram")
              if getattr(args, k, None) is not None}
    template = chat_template(args)
    if template is not None:
        engine["chat_template"] = template
    return dict(device=args.device, dtype=args.dtype, threads=args.threads, n_ctx=args.ctx,
                memory=memory_config(args), compute=getattr(args, "compute", None), **engine)


def print_stats(args: argparse.Namespace, model) -> None:
    """With --stats, the runtime plan and the expert memory's counters on stderr."""
    if getattr(args, "stats", False):
        print(f"runtime: {model.plan.describe()}", file=sys.stderr)
        print(format_kv_cache(model.cache), file=sys.stderr)
        from .tiers import format_memory_stats

        stats = model.memory_stats()
        print(format_memory_stats(stats, model.device, optimal=optimal_bytes(stats)) if stats is not None
              else "expert memory: no statistics (direct: experts are read in place from the mapped file; "
                   "--memory paged counts hits and reads)", file=sys.stderr)
        print(format_time_split(model.time_split()), file=sys.stderr)


def optimal_bytes(stats) -> int | None:
    """Bytes Belady's policy would have read from the disk for the run's own routing trace (from
    where the trace began, at the same slot budgets); None without a trace or a disk tier."""
    trace = stats.trace() if hasattr(stats, "trace") else None
    if trace is None or getattr(stats, "trace_origin", None) is None:
        return None
    from strata.bench.cache import optimal_disk_bytes

    return optimal_disk_bytes(trace, stats.trace_origin)


def format_kv_cache(cache) -> str:
    """One line: the KV cache's element type, bytes per position and size."""
    from strata.units import format_bytes

    return (f"kv cache: {cache.kv_type}, {cache.bytes_per_token} bytes per token (all layers), "
            f"{cache.n_blocks} blocks of {cache.block_size} positions, {format_bytes(cache.nbytes)}")


def format_time_split(split: dict[str, float]) -> str:
    """One line: milliseconds per processed token in each part of the forward pass."""
    parts = ("attention", "expert_compute", "expert_wait", "dequantization", "other")
    per = ", ".join(f"{p.replace('_', ' ')} {1e3 * split[p]:.2f}" for p in parts)
    return f"time per token (ms, {split['tokens']} tokens, {split['total_s']:.2f} s in forward passes): {per}"
