"""Random Qwen3-MoE checkpoints in Hugging Face's layout (config.json, safetensors, tokenizer).

`build_checkpoint`: the tiny float32 model of `strata demo` and of the memory tests, with a BPE
tokenizer trained on the spot. `write_checkpoint`: bfloat16 checkpoints of any size for the
converter's streaming tests and benchmarks, one shard per layer written tensor by tensor. Both
share CONFIG, the tensor table and the tokenizer facts of `strata.synth.tokenizer`. The weights
are random: this is data to run the code on, never a model to judge.

Must not import transformers or torch: the installed package (numpy, tokenizers) builds it all.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from strata.tokenizer import bytes_to_unicode

from .safetensors import save_f32, to_bf16, write_safetensors
from .tokenizer import EOS, SPECIALS, byte_tokenizer_json, save_tokenizer, tokenizer_config, train_byte_bpe, \
    word_corpus

CONFIG = {  # small, but every expert row a whole Q4_K block (256 values)
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
    "intermediate_size": 512, "moe_intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def top_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Embeddings, output norm and head."""
    v, h = cfg["vocab_size"], cfg["hidden_size"]
    return {"model.embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "model.norm.weight": (h,)}


def layer_shapes(cfg: dict, layer: int) -> dict[str, tuple[int, ...]]:
    """One decoder layer's tensors, per-expert names (the layout `save_pretrained` writes)."""
    h, d, e, f = cfg["hidden_size"], cfg["head_dim"], cfg["num_experts"], cfg["moe_intermediate_size"]
    q, kv, p = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d, f"model.layers.{layer}."
    shapes = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
              p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
              p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
              p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
              p + "mlp.gate.weight": (e, h)}
    for x in range(e):
        shapes[p + f"mlp.experts.{x}.gate_proj.weight"] = (f, h)
        shapes[p + f"mlp.experts.{x}.up_proj.weight"] = (f, h)
        shapes[p + f"mlp.experts.{x}.down_proj.weight"] = (h, f)
    return shapes


def _tiny_weights(cfg: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """float32 values: norms ones, embeddings of unit scale, a head of 0.3 (logits with margins),
    the rest 0.05. Drawn in table order, norms drawing nothing, so a seed gives one model."""
    shapes = dict(top_shapes(cfg))
    for i in range(cfg["num_hidden_layers"]):
        shapes |= layer_shapes(cfg, i)
    std = {"model.embed_tokens.weight": 1.0, "lm_head.weight": 0.3}
    return {name: np.ones(shape, np.float32) if name.endswith("norm.weight")
            else (rng.standard_normal(shape) * std.get(name, 0.05)).astype(np.float32)
            for name, shape in shapes.items()}


def _readable_rows(folder: Path, n_vocab: int) -> np.ndarray:
    """[V] bool: tokens whose bytes are all printable ASCII (not specials, not lone high bytes)."""
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    keep = np.zeros(n_vocab, dtype=bool)
    for piece, i in vocab.items():
        keep[i] = i >= len(SPECIALS) and all(32 <= byte_of.get(c, 0) < 127 for c in piece)
    return keep


def build_tokenizer(folder: Path, vocab_size: int = 512, seed: int = 0) -> int:
    """Train the demo's byte-level BPE (Qwen2 split rule) and save it into `folder`; its size."""
    tok = train_byte_bpe("qwen2", vocab_size, word_corpus(2000, seed))
    save_tokenizer(tok, folder)
    return tok.get_vocab_size()


def build_checkpoint(folder: Path, seed: int = 0, readable: bool = False, **config: int) -> Path:
    """A tiny random Qwen3-MoE checkpoint with its tokenizer in `folder`; `config` overrides
    entries of CONFIG (e.g. num_hidden_layers, num_experts). `readable` zeroes the output rows of
    tokens that would print as broken bytes, so random weights at least emit word pieces."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(CONFIG, **config, vocab_size=build_tokenizer(folder, seed=seed))
    cfg["eos_token_id"] = SPECIALS.index(EOS)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    weights = _tiny_weights(cfg, np.random.default_rng(seed))
    if readable:
        weights["lm_head.weight"][~_readable_rows(folder, cfg["vocab_size"])] = 0.0
    save_f32(folder / "model.safetensors", weights)
    return folder


def streaming_config(hidden: int, n_layers: int, n_experts: int, moe_ff: int, vocab: int = 512) -> dict:
    """CONFIG at another size: heads of 128, bfloat16."""
    return dict(CONFIG, hidden_size=hidden, num_hidden_layers=n_layers, num_attention_heads=hidden // 128,
                head_dim=128, intermediate_size=2 * moe_ff, moe_intermediate_size=moe_ff, num_experts=n_experts,
                vocab_size=vocab, max_position_embeddings=4096, torch_dtype="bfloat16")


def write_checkpoint(folder: str | Path, *, hidden: int = 1024, n_layers: int = 4, n_experts: int = 32,
                     moe_ff: int = 512, seed: int = 0) -> int:
    """A bfloat16 checkpoint of any size, never held in memory: one shard per layer plus one for
    embeddings and head, with an index, and a byte-level tokenizer with no merges. Values are
    Gaussian of std 0.02. Returns the tensor bytes written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = streaming_config(hidden, n_layers, n_experts, moe_ff)
    rng = np.random.default_rng(seed)
    shards = {"model-embed.safetensors": top_shapes(cfg)}
    for layer in range(n_layers):
        shards[f"model-layer{layer:04d}.safetensors"] = layer_shapes(cfg, layer)
    total, weight_map = 0, {}
    for fname, shapes in shards.items():
        def values(name: str, shapes=shapes) -> np.ndarray:
            return to_bf16(rng.standard_normal(shapes[name], dtype=np.float32) * np.float32(0.02))

        total += write_safetensors(folder / fname, {n: ("BF16", s) for n, s in shapes.items()}, values)
        weight_map.update({name: fname for name in shapes})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(cfg["vocab_size"])))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=1))
    return total
