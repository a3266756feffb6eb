"""A synthetic Qwen3-MoE GGUF of any size that Strata can decode: random but well-formed weights.

    python benchmarks/synthetic_moe.py OUT.gguf --gib 1.5 [--hidden 1024 --ff 512 --experts 208 --top-k 4]
    python benchmarks/synthetic_moe.py OUT.gguf --shape medium        # a named shape (SHAPES below)
    python benchmarks/synthetic_moe.py OUT.gguf --arch llama --layers 24 --experts 8 --top-k 2 \
        --ff 3584 --heads 8 --heads-kv 2 --expert-type Q4_K         # Mixtral-shaped

Written with gguf-py's writer tensor by tensor (peak memory: one tensor), so files much larger
than RAM are fine. Expert tensors are Q4_K and attention Q8_0, quantized from Gaussian values of
std weight_scale / sqrt(row length); norms are ones, routers and embeddings Gaussian. The model
computes finite logits and routes tokens roughly uniformly over the experts (the hard case for
a cache); `weight_scale` sets how much each layer changes the residual stream, so how well the
router look-ahead predicts (real models change it little from one layer to the next).
The number of layers is chosen to reach the size asked for (or given with --layers). The file's
own pages are dropped from the page cache after writing, so the first read of it goes to the disk.

Options beyond the defaults: `--expert-type` (any format strata.native quantizes: Q4_0, Q4_K,
...), `--arch llama` (Mixtral as llama.cpp's converter writes it: no q/k norms, head size
hidden / heads, expert FFN width in feed_forward_length), `--vocab`, `--heads`, `--heads-kv`,
and `--shape NAME` for the shapes the benchmarks share (SHAPES: FACTS.md's "medium" and
"large", a Mixtral-shaped file, tiny smoke-test files).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from strata.synth.gguf_file import ROUTER_SKEW, Shape, file_bytes  # noqa: E402
from strata.synth.gguf_file import write as write_shape  # noqa: E402


def _converted(arch: str, fixture: str, expert_type: str, **hf) -> dict:
    """A shape converted from the test fixture `fixture` (write_converted): 12 layers of hidden
    1024 with 16 heads over 4 key/value heads, unless `hf` says otherwise."""
    base = dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4)
    return dict(arch=arch, fixture=fixture, expert_type=expert_type, hf={**base, **hf})


#: Named shapes (keyword arguments of `write`, with `n_layers`) shared by the benchmarks.
#: medium/large: FACTS.md's llama.cpp reference files (1.4 and 5.5 GB; Gaussian routers: near-uniform
#: routing, layers independent); large-routed: large with routing like a real model's
#: (strata.synth.gguf_file: popularity skew, layer-to-layer locality, layers that change the
#: residual stream little, as the presets have); mixtral: 8 experts top-2 with Mixtral's FFN ratio
#: (3.5 x hidden), Q4_K experts (1.2 GB); small: medium's layers, 4 of them (0.23 GB); tiny*: smoke
#: tests (~5 MB).
SHAPES: dict[str, dict] = {
    "medium": dict(arch="qwen3moe", n_layers=24, n_experts=64, top_k=8, hidden=1024, ff=512, expert_type="Q4_0"),
    "large": dict(arch="qwen3moe", n_layers=48, n_experts=128, top_k=8, hidden=1024, ff=512, expert_type="Q4_0"),
    "large-routed": dict(arch="qwen3moe", n_layers=48, n_experts=128, top_k=8, hidden=1024, ff=512,
                         expert_type="Q4_0", weight_scale=0.3, skew=ROUTER_SKEW),
    # Converted from transformers' own classes (write_converted; `hf` overrides the test fixture's
    # config): gpt-oss (sinks, sliding windows of 128 on alternate layers, biases, clamped experts;
    # MXFP4 experts, 0.7 GB) and DeepSeek-V3 (latent attention with a query LoRA, a dense first
    # layer, sigmoid routing over 4 groups with a selection bias, a shared expert; Q4_K experts).
    "gpt-oss": _converted("gpt-oss", "gptoss", "MXFP4", head_dim=64, intermediate_size=1024, num_local_experts=32,
                          num_experts_per_tok=4, sliding_window=128),
    "deepseek": _converted("deepseek2", "deepseek3", "Q4_K", num_key_value_heads=16, intermediate_size=2048,
                           moe_intermediate_size=512, n_routed_experts=32, num_experts_per_tok=4, n_group=4,
                           topk_group=2, q_lora_rank=384, kv_lora_rank=256, qk_rope_head_dim=32,
                           qk_nope_head_dim=64, v_head_dim=64),
    # MiniMax-M2 (q/k norms over all heads, RoPE on half of each head, a sigmoid router with a
    # selection bias; Q4_K experts, 0.35 GB)
    "minimax-m2": _converted("minimax-m2", "minimax", "Q4_K", head_dim=64, rotary_dim=32, intermediate_size=512,
                             num_local_experts=32, num_experts_per_tok=4),
    # GLM-4.5 (a dense first layer, q/k norms and biases, RoPE on half of each head, sigmoid routing
    # with a selection bias and a shared expert; Q4_K experts)
    "glm4moe": _converted("glm4moe", "glm4moe", "Q4_K", intermediate_size=2048, moe_intermediate_size=512,
                          n_routed_experts=32, num_experts_per_tok=4),
    # Llama 4 Scout's form (every layer MoE with a shared expert, chunked local attention on three
    # layers of four, NoPE with llama.cpp's fixed query temperature on the fourth; Q4_K experts)
    "llama4": _converted("llama4", "llama4cpp", "Q4_K", head_dim=64, intermediate_size=512,
                         intermediate_size_mlp=2048, num_local_experts=32, num_experts_per_tok=4,
                         interleave_moe_layer_step=1),
    # Qwen3.5-MoE (9 gated DeltaNet layers of 8 key / 16 value heads of 64, 3 full-attention layers
    # with an output gate, a gated shared expert everywhere; Q4_K experts)
    "qwen35moe": _converted("qwen35moe", "qwen35moe", "Q4_K", head_dim=64, moe_intermediate_size=512,
                            shared_expert_intermediate_size=512, num_experts=32, num_experts_per_tok=4,
                            linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=64,
                            linear_value_head_dim=64),
    "mixtral": dict(arch="llama", n_layers=24, n_experts=8, top_k=2, hidden=1024, ff=3584, expert_type="Q4_K",
                    n_head=8, n_head_kv=2),
    "small": dict(arch="qwen3moe", n_layers=4, n_experts=64, top_k=8, hidden=1024, ff=512, expert_type="Q4_0"),
    "tiny": dict(arch="qwen3moe", n_layers=2, n_experts=8, top_k=2, hidden=256, ff=256, expert_type="Q4_0",
                 n_head=2, n_head_kv=1),
    "tiny-mixtral": dict(arch="llama", n_layers=2, n_experts=4, top_k=2, hidden=256, ff=512, expert_type="Q4_K",
                         n_head=2, n_head_kv=1),
}


def write(path: Path, target_bytes: int = 0, *, hidden: int = 1024, ff: int = 512, n_experts: int = 208,
          top_k: int = 4, vocab: int = 512, n_head: int = 4, n_head_kv: int = 1, seed: int = 0,
          weight_scale: float = 1.0, n_layers: int | None = None, expert_type: str = "Q4_K",
          arch: str = "qwen3moe", skew: float = 0.0) -> Path:
    """Write the model (strata.synth.gguf_file, Gaussian routers); returns `path`. Layers:
    `n_layers`, or as many as reach `target_bytes` (at least 2)."""
    expert_type = getattr(expert_type, "name", expert_type)
    shape = Shape(arch=arch, n_layers=1, n_experts=n_experts, top_k=top_k, hidden=hidden, ff=ff, n_head=n_head,
                  n_head_kv=n_head_kv, vocab=vocab, expert_type=expert_type, weight_scale=weight_scale, seed=seed,
                  skew=skew)
    if not n_layers:
        per_layer = file_bytes(shape) - file_bytes(replace(shape, n_layers=0))
        n_layers = max(2, round(target_bytes / per_layer))
    return write_shape(path, replace(shape, n_layers=n_layers))


def write_converted(path: Path, *, fixture: str, hf: dict, expert_type: str, arch: str = "", seed: int = 0) -> Path:
    """A random model from transformers' own classes with the test fixture `fixture`'s recipe
    (tests/convert/fixtures.py: real sinks, biases and selection biases, weights rounded to the
    checkpoint dtype, a byte-level BPE tokenizer trained on the spot) and its config overridden by
    `hf`, saved and converted by strata.convert with `expert_type` experts. Needs torch and
    transformers (the test extras). Peak memory: the float32 model, 4 bytes per parameter."""
    import shutil
    import tempfile

    from converters import TypePolicy, convert
    from tests.convert.fixtures import MORE_SPECS, build_model, save_checkpoint, train_byte_bpe

    base = MORE_SPECS[fixture]
    spec = replace(base, config=dict(base.config, **hf))
    tok = train_byte_bpe(spec.tokenizer)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        model = build_model(spec, tok, seed=seed)
        folder = save_checkpoint(model, spec, tok, Path(tmp) / "hf", fused=False, max_shard_size="1GB")
        del model
        convert(folder, path, TypePolicy.from_args(experts=expert_type.lower()), name=f"synthetic-{fixture}",
                n_threads=2)
        shutil.rmtree(folder)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--gib", type=float, default=1.5)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ff", type=int, default=512)
    p.add_argument("--experts", type=int, default=208)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--weight-scale", type=float, default=1.0)
    p.add_argument("--layers", type=int, default=None, help="number of layers (overrides --gib)")
    p.add_argument("--expert-type", default="Q4_K", help="GGML type of the expert tensors (Q4_K, Q4_0, ...)")
    p.add_argument("--arch", choices=("qwen3moe", "llama"), default="qwen3moe", help="llama: Mixtral-shaped")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--heads-kv", type=int, default=1)
    p.add_argument("--shape", choices=sorted(SHAPES), default=None, help="a named shape; overrides the above")
    a = p.parse_args()
    if a.shape and "fixture" in SHAPES[a.shape]:
        write_converted(a.out, **SHAPES[a.shape])
    elif a.shape:
        write(a.out, weight_scale=a.weight_scale, vocab=a.vocab, **SHAPES[a.shape])
    else:
        write(a.out, int(a.gib * 2**30), hidden=a.hidden, ff=a.ff, n_experts=a.experts, top_k=a.top_k,
              weight_scale=a.weight_scale, n_layers=a.layers, expert_type=a.expert_type, arch=a.arch,
              vocab=a.vocab, n_head=a.heads, n_head_kv=a.heads_kv)
    print(f"{a.out}: {a.out.stat().st_size / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
