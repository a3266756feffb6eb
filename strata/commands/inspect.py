"""`strata inspect MODEL.gguf [--raw | --json]`: what a GGUF file holds, whether and how it runs.

A summary first (inspect_summary.py: the model, the file, the tokenizer, the verdict, the RAM and
disk it needs, how it would run here); `--raw` adds every field (hyperparameters, bytes per ggml
type, each layer's expert slabs, the unit the pager moves), `--placement` each layer's experts.
The facts come from `strata.gguf.ModelFile.summary()`; this module only renders them.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from strata.defaults import DEFAULT_CTX
from strata.errors import StrataError
from strata.units import format_bytes

from .common import add_hf_arg, add_kv_type_arg, resolve_model


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `inspect` on an argparse subparsers object (the `strata` CLI's)."""
    p = subparsers.add_parser("inspect", help="show a GGUF model's architecture, sizes and expert layout",
                              description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=None, help="GGUF file, or -hf")
    add_hf_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--raw", action="store_true",
                   help="after the summary, list every field: hyperparameters, bytes per ggml type, each layer's "
                        "expert slabs, the parts of a split file")
    g = p.add_argument_group("--placement: where experts would start, for these budgets")
    g.add_argument("--placement", action="store_true",
                   help="print which experts would start on the device, in host RAM and on the disk, the "
                        "expected share of expert reads per tier, and what runs each step (the runtime plan: "
                        "the model is loaded for it, with these budgets)")
    g.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    g.add_argument("--device-mem", default=None, metavar="SIZE", help="device budget, e.g. 20G")
    g.add_argument("--host-mem", default=None, metavar="SIZE", help="host budget, e.g. 64G")
    g.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context length the KV cache is sized for "
                                                                "(default %(default)s)")
    g.add_argument("--compute", choices=("auto", "packed", "float"), default=None, help="as strata generate's")
    add_kv_type_arg(g)
    g.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="with --placement: the expert-parallel shard plan over N ranks instead of the tiers (which "
                        "rank owns which experts of each layer, each rank's expected load and expert bytes; no "
                        "torchrun needed)")
    g.add_argument("--replicate-hot", type=int, default=0, metavar="N",
                   help="with --ranks: each layer's N hottest experts on every rank, as strata generate's")
    p.set_defaults(func=run)
    return p


def _render(value: Any, key: str, indent: int, out: TextIO, in_bytes: bool = False) -> None:
    """One entry; numbers are byte counts when their key, or a parent's, says 'bytes'."""
    pad = "  " * indent
    in_bytes = in_bytes or "bytes" in key.lower()
    if isinstance(value, dict):
        print(f"{pad}{key}:", file=out)
        for k, v in value.items():
            _render(v, str(k), indent + 1, out, in_bytes)
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
        print(f"{pad}{key}:", file=out)
        for i, v in enumerate(value):
            _render(v, f"[{i}]", indent + 1, out)
    else:
        shown = value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and in_bytes:
            shown = f"{format_bytes(value)} ({value})"
        elif isinstance(value, (list, tuple)) and len(value) > 16:
            shown = f"[{', '.join(map(str, value[:8]))}, ... {len(value)} values]"
        print(f"{pad}{key}: {shown}", file=out)


def _layer_ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) or "none"


def render_parts(parts: list[dict[str, Any]], out: TextIO) -> None:
    """The files of a split model (llama.cpp's gguf-split): one line each; nothing for one file."""
    if len(parts) <= 1:
        return
    print(f"  parts: {len(parts)} files (llama.cpp's split layout; metadata in part 1)", file=out)
    for p in parts:
        layers = f"layer{'s' if len(p['expert_layers']) > 1 else ''} {_layer_ranges(p['expert_layers'])}"
        experts = (f"{p['expert_tensors']} expert tensor{'s' if p['expert_tensors'] > 1 else ''} ({layers})"
                   if p["expert_tensors"] else "no expert tensors")
        print(f"    {p['part']}: {p['path']}: {format_bytes(p['file_bytes'])}, {p['n_tensors']} tensors "
              f"({format_bytes(p['tensor_bytes'])}), {experts}", file=out)


def render_text(summary: dict[str, Any], out: TextIO | None = None) -> None:
    """Every field of ModelFile.summary(), indented under a heading (`strata inspect --raw`)."""
    out = out or sys.stdout
    print("fields:", file=out)
    for key, value in summary.items():
        if key == "parts":
            render_parts(value, out)
        else:
            _render(value, key, 1, out)


def placement(args: argparse.Namespace, model) -> dict[str, Any]:
    """Where experts would start and where reads would come from, for the budgets in `args`, in
    the expert memory `strata.load` would build for them: the paged memory's one pool of RAM slots
    (packed compute on the CPU), else the tiered memory's device and host slots."""
    from strata.engine.resolve import resolve_compute, resolve_device, resolve_dtype
    from strata.engine.build import memory_config_for, ram_budget, reserved_bytes
    from strata.engine.kv_cache import KVCache, kv_type_name
    from strata.memory.machine import Machine
    from strata.memory.placement import estimate, host_slots_for, plan_placement
    from strata.models import cache_dims, cache_states

    device = resolve_device(args.device)
    compute = resolve_compute(args.compute, device, None)
    dtype, machine = resolve_dtype(None, device), Machine.measure(device)
    config, _ = memory_config_for(None, {"device_mem": args.device_mem, "host_mem": args.host_mem}, compute)
    hp = model.hparams
    kv = KVCache.bytes_for(hp.n_layers, 1, args.ctx, *cache_dims(hp), dtype, kv_type=args.kv_type,
                          states=cache_states(hp))
    reserved = reserved_bytes(model, dtype, compute, kv)
    head = {"device": str(device), "compute": compute, "memory": config.backend(compute),
            "kv_type": kv_type_name(dtype) if args.kv_type is None else args.kv_type, "kv_cache_bytes": kv}
    if head["memory"] == "paged":
        from strata.engine.build import settle_default

        settled, why = settle_default(None, {"device_mem": args.device_mem, "host_mem": args.host_mem}, config, "",
                                      model, device, dtype, compute, kv, machine)
        if not callable(settled) and settled.kind == "direct":  # what load settles on for a cached file that fits
            head |= {"memory": "direct", "memory_why": why}
        budget, slots = host_slots_for(model, machine, ram_budget(config, model, machine, reserved))
        est = estimate(model, slots, 0)
        return head | {"slot_form": "packed", "ram_budget_bytes": budget, "ram_slots_per_layer": slots,
                       "n_experts": est.n_experts, "estimate_from": est.source,
                       "expected_share": {"ram": est.device_share, "disk": est.disk_share},
                       "disk_bytes_per_token": est.disk_bytes_per_token,
                       "layers": [{"layer": x["layer"], "ram": x["device"]} for x in est.layers]}
    plan, host_slots, est = plan_placement(model, device, dtype, compute, machine=machine, device_mem=config.device_mem,
                                           host_mem=config.host_mem, reserved=reserved)
    return head | {"slot_form": plan.form, "device_budget_bytes": plan.device_budget,
                   "host_budget_bytes": plan.host_budget if args.host_mem else None,
                   "device_slots_per_layer": est.device_slots, "host_slots_per_layer": host_slots,
                   "n_experts": est.n_experts, "estimate_from": est.source,
                   "expected_share": {"device": est.device_share, "host": est.host_share, "disk": est.disk_share},
                   "disk_bytes_per_token": est.disk_bytes_per_token, "layers": est.layers}


def runtime_plan(args: argparse.Namespace) -> dict[str, Any]:
    """What runs each kind of step with these budgets, and why (strata.runtime.plan): the
    model is loaded, as `strata generate` would load it, to decide."""
    import strata

    try:
        with strata.load(args.model, device=args.device, compute=args.compute, device_mem=args.device_mem,
                         host_mem=args.host_mem, n_ctx=args.ctx, max_batch=1) as m:
            plan = m.plan
    except (StrataError, MemoryError) as e:
        return {"error": str(e)}
    return {step: {"runner": runner, "why": why} for step, runner, why in plan.rows()} | {"line": plan.describe()}


def render_placement(p: dict[str, Any], out: TextIO) -> None:
    from .tiers import fast_tier

    share, fast, E = p["expected_share"], fast_tier(p["device"]), p["n_experts"]
    if p.get("memory") in ("direct", "paged"):
        paged = (f"per layer {p['ram_slots_per_layer']}/{E} experts in RAM slots, the rest read from the disk on "
                 f"demand; expected share of expert reads ({p['estimate_from']}): RAM {share['ram']:.0%}, disk "
                 f"{share['disk']:.0%} ({format_bytes(p['disk_bytes_per_token'])} from the disk per token)")
        if p["memory"] == "direct":  # a cached file that fits: what --memory paged would do, after why
            print(f"placement on {p['device']} ({p['compute']} compute, direct memory): {p['memory_why']}; with "
                  f"--memory paged (budget {format_bytes(p['ram_budget_bytes'])}): {paged}", file=out)
        else:
            print(f"placement on {p['device']} ({p['compute']} compute, paged memory: one pool of RAM slots, budget "
                  f"{format_bytes(p['ram_budget_bytes'])}): {paged}", file=out)
    else:
        print(f"placement on {p['device']} ({p['compute']} compute, tiered memory, {p['slot_form']} slots): per layer "
              f"{p['device_slots_per_layer']}/{E} experts in {fast} slots, {p['host_slots_per_layer']}/{E} in host "
              f"RAM; expected share of expert reads ({p['estimate_from']}): {fast} {share['device']:.0%}, host "
              f"{share['host']:.0%}, disk {share['disk']:.0%} ({format_bytes(p['disk_bytes_per_token'])} from the "
              f"disk per token)", file=out)
    if not p["layers"]:
        print("  (the file has no routing statistics: slots start empty and fill with the first tokens' experts)",
              file=out)
    for x in p["layers"]:
        where = f"RAM {x['ram']}" if "ram" in x else f"{fast} {x['device']}, host {x['host']}"
        print(f"  layer {x['layer']}: {where} at start, the rest on the disk", file=out)
    r = p.get("runtime", {})
    print(f"runtime: {r['line']}" if "line" in r else f"runtime: not decided ({r.get('error')})", file=out)


def _here(args: argparse.Namespace, model, summary: dict[str, Any]) -> dict[str, Any] | str | None:
    """The placement of the summary's `here:` line: --placement's, else computed for it; the reason
    as text where the budgets cannot hold the model; None for a file without experts or that does not run."""
    if "placement" in summary:
        return summary["placement"]
    if not model.expert_layers or not summary["verdict"]["runs"]:
        return None
    try:
        return placement(args, model)
    except (StrataError, MemoryError) as e:
        return f"does not fit: {e}"


def run_verdict(args: argparse.Namespace, model) -> dict[str, Any]:
    """Whether the file runs with the compute path `strata generate` would take (or --compute)."""
    from strata.engine.resolve import resolve_compute, resolve_device
    from strata.engine.verdict import verdict

    device = resolve_device(getattr(args, "device", "cpu"))
    compute = resolve_compute(getattr(args, "compute", None), device, None)
    return verdict(model, compute, cuda=device.type == "cuda").to_dict()


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from strata.gguf import open_model

    out = out or sys.stdout
    if (getattr(args, "ranks", None) is None and getattr(args, "replicate_hot", 0)) or \
            (getattr(args, "ranks", None) is not None and not args.placement):
        from strata.errors import StrataArgumentError

        raise StrataArgumentError("--ranks goes with --placement, and --replicate-hot with --ranks")
    if getattr(args, "ctx", 1) < 1:
        from strata.errors import StrataArgumentError

        raise StrataArgumentError(f"--ctx: expected a positive context length, found {args.ctx}")
    resolve_model(args)
    with open_model(args.model) as model:
        summary = model.summary()
        if getattr(args, "placement", False):
            if not model.expert_layers:
                raise StrataError(f"{args.model}: --placement: the model has no routed experts")
            if getattr(args, "ranks", None) is not None:
                from .ranks import rank_placement

                summary["ranks"] = rank_placement(model, args.ranks, args.replicate_hot)
            else:
                summary["placement"] = placement(args, model)
        summary["verdict"] = run_verdict(args, model)
        if not args.json:
            from .inspect_summary import overview

            lines = overview(model, summary, summary["verdict"], _here(args, model, summary))
    if "placement" in summary:  # after the file is closed: the load opens it again
        summary["placement"]["runtime"] = runtime_plan(args)
    if args.json:
        json.dump(summary, out, indent=1, default=str)
        print(file=out)
    else:
        from .inspect_summary import render_overview

        raw = getattr(args, "raw", False)
        render_overview(args.model, lines, raw, out)
        if raw:
            render_text({k: v for k, v in summary.items() if k not in ("placement", "verdict", "ranks")}, out)
        if "placement" in summary:
            render_placement(summary["placement"], out)
        if "ranks" in summary:
            from .ranks import render_ranks

            render_ranks(summary["ranks"], out)
    return 0
