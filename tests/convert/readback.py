"""Reading converted files back: tensors as float32, and the GGUF name of every HF parameter."""
from __future__ import annotations

import gguf
import gguf.quants
import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from converters.base import permute_rope_rows

ARCH = {"mixtral": "llama", "qwen2moe": "qwen2moe", "qwen3moe": "qwen3moe", "olmoe": "olmoe"}


def read_tensors(path) -> dict[str, tuple[T, np.ndarray]]:
    """name -> (type, float32 values in row-major shape) for every tensor of a GGUF file."""
    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)
        out[t.name] = (T(t.tensor_type), values.astype(np.float32))
    return out


def field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def source_tensors(tiny) -> dict[str, np.ndarray]:
    """What every GGUF tensor should hold, computed from the in-memory transformers model."""
    arch = gguf.MODEL_ARCH[ARCH[tiny.spec.key].upper()]
    cfg = tiny.model.config
    name_map = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    out = {}
    for key, value in tiny.model.state_dict().items():
        v = value.float().numpy()
        if key.endswith("experts.gate_up_proj"):
            bid, half = key.split(".")[2], v.shape[1] // 2
            out[f"blk.{bid}.ffn_gate_exps.weight"], out[f"blk.{bid}.ffn_up_exps.weight"] = v[:, :half], v[:, half:]
        elif key.endswith("experts.down_proj"):
            out[f"blk.{key.split('.')[2]}.ffn_down_exps.weight"] = v
        else:
            name = name_map.get_name(key, try_suffixes=(".weight", ".bias"))
            assert name is not None, key
            if arch == gguf.MODEL_ARCH.LLAMA and ".attn_q." in name:
                v = permute_rope_rows(v, cfg.num_attention_heads)
            elif arch == gguf.MODEL_ARCH.LLAMA and ".attn_k." in name:
                v = permute_rope_rows(v, cfg.num_key_value_heads)
            out[name] = v
    return out



def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of permute_rope_rows: interleaved rotary pairs back to half-split rows."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def model_from_gguf(tiny, path) -> torch.nn.Module:
    """A copy of the fixture's transformers model carrying the file's own (dequantized) weights."""
    import copy
    model = copy.deepcopy(tiny.model)
    tensors = {name: values for name, (_, values) in read_tensors(path).items()}
    cfg, llama = model.config, ARCH[tiny.spec.key] == "llama"
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH[ARCH[tiny.spec.key].upper()], cfg.num_hidden_layers)
    state = {}
    for key, value in model.state_dict().items():
        bid = key.split(".")[2] if key.startswith("model.layers.") else None
        if key.endswith("experts.gate_up_proj"):
            v = np.concatenate([tensors[f"blk.{bid}.ffn_gate_exps.weight"], tensors[f"blk.{bid}.ffn_up_exps.weight"]], 1)
        elif key.endswith("experts.down_proj"):
            v = tensors[f"blk.{bid}.ffn_down_exps.weight"]
        else:
            name = name_map.get_name(key, try_suffixes=(".weight", ".bias"))
            v = tensors[name]
            if llama and ".attn_q." in name:
                v = unpermute_rope_rows(v, cfg.num_attention_heads)
            elif llama and ".attn_k." in name:
                v = unpermute_rope_rows(v, cfg.num_key_value_heads)
        state[key] = torch.from_numpy(np.ascontiguousarray(v)).reshape(value.shape)
    model.load_state_dict(state)
    return model.eval()
