"""MiMo-V2-Flash test checkpoints in the released form (tests/convert/fixtures.py's `finish` for "mimo2").

transformers saves MiMoV2FlashConfig with nested per-layer-type `rope_parameters` and without the
released config's `swa_*` / `hybrid_layer_pattern` keys, which llama.cpp's converter reads; the
released checkpoints also carry multi-token-prediction layers (`model.mtp.layers.N.*`, a dense
SWA-shaped block with enorm / hnorm / eh_proj) that transformers' class ignores on load. `released`
rewrites config.json in the released key set (flat rope keys: `rope_theta`, `swa_rope_theta`,
`partial_rotary_factor`, and one flat `rope_parameters` for the full layers, which is what
AutoConfig hands llama.cpp's converter) and, when asked, adds random MTP layers.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch


def released(model: torch.nn.Module, folder: Path, n_mtp: int = 0, seed: int = 5) -> None:
    """config.json as the released checkpoints have it (flat rope keys, swa_* sizes, the
    hybrid layer pattern as 1 = sliding); `n_mtp` random MTP layers added to model.safetensors."""
    c = model.config
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    full, sliding = cfg["rope_parameters"]["full_attention"], cfg["rope_parameters"]["sliding_attention"]
    swa = [int(t == "sliding_attention") for t in c.layer_types]
    # one flat rope_parameters (the full layers'), as AutoConfig hands it to llama.cpp's converter
    cfg.update(rope_parameters=dict(full), rope_theta=full["rope_theta"], swa_rope_theta=sliding["rope_theta"],
               partial_rotary_factor=full["partial_rotary_factor"], hybrid_layer_pattern=swa,
               swa_num_key_value_heads=2 * c.num_key_value_heads, swa_num_attention_heads=c.num_attention_heads,
               swa_head_dim=c.head_dim, swa_v_head_dim=c.v_head_dim, topk_method="noaux_tc", scoring_func="sigmoid",
               layernorm_epsilon=c.rms_norm_eps, moe_layer_freq=[int(t == "sparse") for t in c.mlp_layer_types])
    path.write_text(json.dumps(cfg, indent=2))
    if n_mtp:
        add_mtp_layers(model, folder, n_mtp, seed)


def mtp_tensors(model: torch.nn.Module, n_mtp: int, seed: int = 5) -> dict[str, torch.Tensor]:
    """Random MTP layers as the released checkpoints name them: per layer the token / hidden
    norms and their projection [D, 2D], a sliding-window attention block (sinks) and a dense FFN."""
    c = model.config
    D, H, hd, hv, Hkv, ff = (c.hidden_size, c.num_attention_heads, c.head_dim, c.v_head_dim,
                             2 * c.num_key_value_heads, c.intermediate_size)
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, mean: float = 0.0, std: float = 0.05) -> torch.Tensor:
        return torch.randn(shape, generator=g) * std + mean

    out = {}
    for i in range(n_mtp):
        p = f"model.mtp.layers.{i}."
        out.update({p + "enorm.weight": rnd(D, mean=1.0), p + "hnorm.weight": rnd(D, mean=1.0),
                    p + "eh_proj.weight": rnd(D, 2 * D), p + "input_layernorm.weight": rnd(D, mean=1.0),
                    p + "self_attn.q_proj.weight": rnd(H * hd, D), p + "self_attn.k_proj.weight": rnd(Hkv * hd, D),
                    p + "self_attn.v_proj.weight": rnd(Hkv * hv, D), p + "self_attn.o_proj.weight": rnd(D, H * hv),
                    p + "self_attn.attention_sink_bias": rnd(H, std=0.5),
                    p + "post_attention_layernorm.weight": rnd(D, mean=1.0), p + "mlp.gate_proj.weight": rnd(ff, D),
                    p + "mlp.up_proj.weight": rnd(ff, D), p + "mlp.down_proj.weight": rnd(D, ff),
                    p + "final_layernorm.weight": rnd(D, mean=1.0)})
    return out


def add_mtp_layers(model: torch.nn.Module, folder: Path, n_mtp: int, seed: int = 5) -> None:
    from safetensors.torch import load_file, save_file

    files = sorted(folder.glob("*.safetensors"))
    assert len(files) == 1, f"one safetensors file expected in {folder}, found {files}"
    tensors = load_file(files[0])
    dtype = next(iter(tensors.values())).dtype
    tensors.update({k: v.to(dtype) for k, v in mtp_tensors(model, n_mtp, seed).items()})
    save_file(tensors, files[0], metadata={"format": "pt"})
