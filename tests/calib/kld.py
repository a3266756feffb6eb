"""The calibration acceptance harness, shared by tests/calib and benchmarks/calib_kld.py: tiny
fixture checkpoints with outlier channels, converted by rounding, --imatrix and --calib, and the
KL divergence of each to the float32 file's logits on held-out text.

Outlier channels (`sharpen`): random models' activations are near-uniform across channels, so
importances and Hessians carry little signal; real models have a few channels far larger than
the rest. A few channels of every RMSNorm weight before attention and the FFN are scaled up
(x8, 1 channel in 32), which gives every matrix input such outliers, as in real models.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from converters import CalibOptions, TypePolicy, convert
from strata.synth.tokenizer import corpus
from tests.fixtures.tiny import zoo

ARCHS = ("mixtral", "qwen2moe", "qwen3moe", "olmoe", "deepseek2", "gptoss")
_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")


def sharpen(hf_dir: Path, out: Path, factor: float = 8.0, every: int = 32, seed: int = 0) -> Path:
    """A copy of checkpoint `hf_dir` whose pre-attention and pre-FFN norms have outlier channels."""
    if out.exists():
        return out
    shutil.copytree(hf_dir, out)
    rng = np.random.default_rng(seed)
    for f in sorted(out.glob("*.safetensors")):
        tensors = load_file(f)
        for name, t in tensors.items():
            if name.endswith(_NORMS):
                pick = torch.from_numpy(rng.choice(t.shape[0], max(1, t.shape[0] // every), replace=False))
                t = t.clone()
                t[pick] = (t[pick].float() * factor).to(t.dtype)
                tensors[name] = t
        save_file(tensors, f, metadata={"format": "pt"})
    return out


def texts(root: Path) -> tuple[Path, Path]:
    """Calibration and held-out text files, drawn from different documents (corpus seeds 1 and 2)."""
    calib, held = root / "calib.txt", root / "heldout.txt"
    calib.write_text(" ".join(corpus(3000, seed=1)))
    held.write_text(" ".join(corpus(3000, seed=2)))
    return calib, held


def logits(path: Path, text: str, n_tokens: int, n_ctx: int = 256) -> torch.Tensor:
    """Scored logits of the first `n_tokens` tokens of `text` (engine, float compute)."""
    from strata.engine.api import load
    with load(path, compute="float", threads=2) as model:
        ids = model.tokenize(text)[:n_tokens]
        return model.perplexity(ids, n_ctx=n_ctx, keep_logits=True).logits


def build(root: Path, key: str, calib_text: Path, calib_tokens: int, methods=("rtn", "imatrix", "gptq")) -> dict:
    """The converted files of one architecture: {'f32': path, 'rtn': path, ...}."""
    from converters.calib.collect import collect_imatrix
    hf = sharpen(zoo().get(key).hf_dir, root / f"{key}-hf")
    files = {"f32": root / f"{key}-f32.gguf"}
    convert(hf, files["f32"], TypePolicy.from_args(outtype="f32"), n_threads=2)
    policy = TypePolicy()
    if "rtn" in methods:
        files["rtn"] = root / f"{key}-rtn.gguf"
        convert(hf, files["rtn"], policy, n_threads=2)
    if "imatrix" in methods:
        files["imatrix_file"] = root / f"{key}.imatrix.gguf"
        collect_imatrix(files["f32"], calib_text.read_text(), files["imatrix_file"], n_tokens=calib_tokens,
                        n_ctx=256, dataset=str(calib_text), progress=False)
        files["imatrix"] = root / f"{key}-imatrix.gguf"
        convert(hf, files["imatrix"], policy, n_threads=2, imatrix=files["imatrix_file"])
    if "gptq" in methods:
        files["gptq"] = root / f"{key}-gptq.gguf"
        convert(hf, files["gptq"], policy, n_threads=2,
                calib=CalibOptions(str(calib_text), calib_tokens, 256, progress=False))
    return files


def kld_rows(root: Path, key: str, calib_tokens: int = 4096, heldout_tokens: int = 2048,
             methods=("rtn", "imatrix", "gptq")) -> list[dict]:
    from strata.engine import compare_logits
    root.mkdir(parents=True, exist_ok=True)
    calib_text, held = texts(root)
    files = build(root, key, calib_text, calib_tokens, methods)
    text = held.read_text()
    base = logits(files["f32"], text, heldout_tokens)
    rows = []
    for m in methods:
        cmp = compare_logits(base, logits(files[m], text, heldout_tokens))
        rows.append({"arch": key, "method": m, "kl_mean": cmp.kl_mean, "kl_max": cmp.kl_max,
                     "top1": cmp.top1_agreement, "n": cmp.n, "bytes": files[m].stat().st_size, "file": str(files[m])})
    rtn = next((r["kl_mean"] for r in rows if r["method"] == "rtn"), None)
    for r in rows:
        r["vs_rtn"] = r["kl_mean"] / rtn - 1 if rtn else 0.0
    return rows


def kld_table(root: Path, archs, calib_tokens: int, heldout_tokens: int) -> list[dict]:
    return [r for key in archs for r in kld_rows(root / key, key, calib_tokens, heldout_tokens)]
