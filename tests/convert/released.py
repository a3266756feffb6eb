"""Re-save a tiny model's HF checkpoint in a release's quantized form, next to a float twin that
holds the same values: the fixtures of the fp8 and MXFP4 source tests."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

#: name, float tensor -> None (kept as it is) or ({stored name: quantized tensor}, the values they hold)
Quantizer = Callable[[str, torch.Tensor], "tuple[dict[str, torch.Tensor], torch.Tensor] | None"]


def quantized_pair(hf_dir: Path, root: Path, quantize: Quantizer, quantization_config: dict) -> tuple[Path, Path, dict]:
    """(quantized checkpoint, float checkpoint of the values it holds, the quantized state) under
    `root`; the quantized one's config.json carries `quantization_config`."""
    q_dir, ref_dir = root / "quantized", root / "ref"
    shutil.copytree(hf_dir, q_dir)
    shutil.copytree(hf_dir, ref_dir)
    (path,) = sorted(hf_dir.glob("*.safetensors"))
    quant, ref = {}, {}
    for name, w in load_file(path).items():
        stored = quantize(name, w)
        if stored is None:
            quant[name] = ref[name] = w
        else:
            quant.update(stored[0])
            ref[name] = stored[1]
    save_file(quant, q_dir / path.name, metadata={"format": "pt"})
    save_file(ref, ref_dir / path.name, metadata={"format": "pt"})
    cfg = json.loads((q_dir / "config.json").read_text())
    cfg["quantization_config"] = quantization_config
    (q_dir / "config.json").write_text(json.dumps(cfg))
    return q_dir, ref_dir, quant
