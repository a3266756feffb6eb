"""The first lines of `strata inspect`: what the file is, whether it runs, the RAM and disk it needs
and how it would run here, in words a user acts on. `--raw` adds every field after them.

Must not: compute what the library already knows; it gathers ModelFile.summary(), the verdict and
the placement `strata inspect --placement` shows, and phrases them.
"""
from __future__ import annotations

from typing import Any, TextIO

from strata.units import format_bytes


def _model_line(hp: Any) -> str:
    """`qwen3moe, 24 layers, 64 routed experts (8 per token), hidden 1024, context 32768 tokens`."""
    words = [hp.arch, f"{hp.n_layers} layers"]
    if hp.n_experts:
        words.append(f"{hp.n_experts} routed experts ({hp.n_experts_used} per token)")
    if hp.n_shared_experts:
        words.append(f"{hp.n_shared_experts} shared expert{'s' if hp.n_shared_experts > 1 else ''}")
    if hp.n_layers_nextn:  # llama.cpp's main graph does not run them either
        n = hp.n_layers_nextn
        words.append(f"{n} multi-token-prediction layer{'s' if n > 1 else ''} (kept, not run)")
    return ", ".join(words + [f"hidden {hp.n_embd}", f"context {hp.context_length} tokens"])


def _file_line(model: Any, summary: dict[str, Any]) -> str:
    """Size, parts, and the ggml types of the experts and of the rest."""
    def types(tensors) -> str:
        return ", ".join(sorted({t.ggml_type.name for t in tensors})) or "none"

    experts = [t for name, t in model.tensors.items() if name not in model.resident]
    parts = len(summary["parts"])
    where = "one file" if parts == 1 else f"{parts} parts (llama.cpp's split files; name any part)"
    line = f"{format_bytes(summary['file_bytes'])} in {where}"
    if experts:
        line += f"; routed experts {format_bytes(summary['expert_bytes'])} ({types(experts)})"
    return line + f", the rest {format_bytes(summary['resident_bytes'])} ({types(model.resident.values())})"


def _tokenizer_line(metadata: dict[str, Any]) -> str:
    kind, tokens = metadata.get("tokenizer.ggml.model"), metadata.get("tokenizer.ggml.tokens")
    if kind is None:
        return "none in the file (token ids only)"
    size = f" ({len(tokens)} tokens)" if tokens is not None else ""
    template = "yes" if metadata.get("tokenizer.chat_template") else "none (strata chat needs --chat-template-file)"
    return f"{kind}{size}; chat template: {template}"


def _needs_line(summary: dict[str, Any], place: dict[str, Any] | None, n_used: int) -> str:
    """RAM to hold the whole model, and what a token reads from the disk when no expert is in RAM."""
    kv = place["kv_cache_bytes"] if place else 0
    line = f"{format_bytes(summary['tensor_bytes'] + kv)} of RAM holds it all"
    if place:
        line += f" (with a KV cache of {format_bytes(kv)})"
    worst = sum(x["expert_bytes"] * n_used for x in summary["expert_layers"].values())
    if worst:
        line += (f"; with less, experts not in RAM are read from the disk, at most "
                 f"{format_bytes(worst)} per token")
    return line


def _here_line(place: dict[str, Any]) -> str:
    """How the placement `strata generate` would start from sets the experts out, with its budget."""
    E, share = place["n_experts"], place["expected_share"]
    disk = place["disk_bytes_per_token"]
    if place["memory"] == "direct":
        return f"{place['device']}, direct memory: {place['memory_why']}"
    if place["memory"] == "paged":
        slots = place["ram_slots_per_layer"]
        head = (f"{place['device']}, paged memory with a RAM budget of {format_bytes(place['ram_budget_bytes'])}: "
                f"{slots}/{E} experts per layer in RAM")
    else:
        slots = place["device_slots_per_layer"] + place["host_slots_per_layer"]
        head = (f"{place['device']}, tiered memory: {place['device_slots_per_layer']}/{E} experts per layer on "
                f"the device, {place['host_slots_per_layer']}/{E} in host RAM")
    if slots >= E:
        return head + "; every expert fits, nothing is read from the disk once they are in"
    return head + (f"; about {share['disk']:.0%} of expert reads from the disk, {format_bytes(disk)} per "
                   f"token (--host-mem raises the budget)")


def overview(model: Any, summary: dict[str, Any], verdict: dict[str, Any],
             here: dict[str, Any] | str | None) -> list[tuple[str, str]]:
    """(label, text) lines for the top of `strata inspect`; `here`: the placement `strata inspect
    --placement` shows, or why there is none (text), or None (no experts, or the file does not run)."""
    place = here if isinstance(here, dict) else None
    lines = [("model", _model_line(model.hparams)), ("file", _file_line(model, summary)),
             ("tokenizer", _tokenizer_line(model.metadata)), ("verdict", verdict["sentence"])]
    if verdict["runs"]:
        lines.append(("needs", _needs_line(summary, place, model.hparams.n_experts_used)))
    if here is not None:
        lines.append(("here", _here_line(place) if place is not None else here))
    return lines


def render_overview(path: str, lines: list[tuple[str, str]], raw: bool, out: TextIO) -> None:
    print(path, file=out)
    for label, text in lines:
        print(f"{label}: {text}", file=out)
    if not raw:
        print("more: --placement (each layer's experts and the runtime plan), --raw (every field), --json",
              file=out)


__all__ = ["overview", "render_overview"]
