"""Synthetic Qwen3-MoE-shaped checkpoints of any size, written without holding them in memory.

For benchmarks and tests of the converter's streaming (memory limits, interruption): the values
are random bfloat16, the tokenizer is a byte-level BPE with no merges, the shapes follow the
config, and each safetensors shard is written tensor by tensor.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from strata.tokenizer import bytes_to_unicode


def _tokenizer_json(vocab_size: int) -> dict:
    alphabet = [bytes_to_unicode()[b] for b in range(256)]
    vocab = {c: i for i, c in enumerate(alphabet)}
    added = [{"id": i, "content": f"<|special_{i}|>", "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in range(256, vocab_size)]
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                                "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": []}}


def config(hidden: int, n_layers: int, n_experts: int, moe_ff: int, vocab: int = 512) -> dict:
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": hidden,
            "num_hidden_layers": n_layers, "num_attention_heads": hidden // 128, "num_key_value_heads": 2,
            "head_dim": 128, "intermediate_size": 2 * moe_ff, "moe_intermediate_size": moe_ff,
            "num_experts": n_experts, "num_experts_per_tok": 2, "vocab_size": vocab,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "norm_topk_prob": True,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _layer_shapes(cfg: dict, layer: int) -> dict[str, tuple[int, ...]]:
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


def _write_shard(path: Path, shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> int:
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for shape in shapes.values():
            values = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            f.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    return offset


def write_checkpoint(folder: str | Path, *, hidden: int = 1024, n_layers: int = 4, n_experts: int = 32,
                     moe_ff: int = 512, seed: int = 0) -> int:
    """Write the checkpoint (one shard per layer plus one for embeddings/head, with an index);
    returns its tensor bytes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config(hidden, n_layers, n_experts, moe_ff)
    rng = np.random.default_rng(seed)
    shards = {"model-embed.safetensors": {"model.embed_tokens.weight": (cfg["vocab_size"], hidden),
                                          "lm_head.weight": (cfg["vocab_size"], hidden),
                                          "model.norm.weight": (hidden,)}}
    for layer in range(n_layers):
        shards[f"model-layer{layer:04d}.safetensors"] = _layer_shapes(cfg, layer)
    total, weight_map = 0, {}
    for fname, shapes in shards.items():
        total += _write_shard(folder / fname, shapes, rng)
        weight_map.update({name: fname for name in shapes})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    (folder / "tokenizer.json").write_text(json.dumps(_tokenizer_json(cfg["vocab_size"])))
    return total
