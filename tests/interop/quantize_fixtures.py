"""GGUF files quantized by llama.cpp's own quantizer, in the types published MoE quants use.

The quantizer is `llama_model_quantize` in the libllama that llama-cpp-python ships (bound by
`llama_cpp.llama_model_quantize`): the code `llama-quantize` runs, with its per-tensor type mixing
(attention, output, embeddings and some expert tensors get other types than the file type), its
`--imatrix` (an array of (tensor name, importances) entries, `llama_model_imatrix_data`) and its
`--tensor-type PATTERN=TYPE` overrides (`llama_model_tensor_override`), which is how "dynamic"
quants give each tensor its own type. Nothing has to be built: CI has it once llama-cpp-python is
installed.

The source file is the qwen3moe fixture of tests/convert/fixtures.py (transformers' class, 2
layers, 4 experts, hidden and expert widths 256, so every matrix row is whole 256-value blocks and
llama.cpp never falls back to another type; output head x8 so top-1 margins mean something) with
its expert and attention weights scaled up (see SCALES), converted to f32 by Strata.

Importance matrix: llama.cpp refuses IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S and (in this version)
IQ3_XXS tensors without one. It is `strata imatrix`'s (`collect_imatrix`: the mean squared
activations entering each matrix, per expert, over corpus text) on the f32 file, handed over as
`llama-quantize --imatrix` hands its file over (per-expert sums / counts, experts never routed to
get 1s) with the same `quantize.imatrix.*` metadata. It is given for the types that demand it and
for the mixed file (published i-quants are made with one); the others are quantized without.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

from converters.calib.collect import collect_imatrix
from converters.calib.imatrix import read_imatrix
from strata.synth.tokenizer import corpus
from tests.convert.fixtures import SPECS, build_model, save_checkpoint, train_byte_bpe
from tests.fixtures.tiny import Tiny
from tests.interop.llama_quantize import llama_quantize

ARCH = "qwen3moe"
#: Factors on transformers' initial weights (std 0.02) by parameter name. Unscaled, the residual
#: stream (unit-scale embeddings) drowns experts and attention: with every expert zeroed the model
#: still agreed on 96% of top-1s, so a test of expert kernels would pass with none. Scaled, zeroing
#: the experts leaves ~1% and scaling one expert's ffn_down by 1.1 moves logits by 2% of their range.
SCALES = {"experts.gate_up_proj": 4.0, "experts.down_proj": 8.0, "self_attn.q_proj": 3.0, "self_attn.k_proj": 3.0,
          "self_attn.v_proj": 3.0, "self_attn.o_proj": 3.0}


@dataclass(frozen=True)
class Case:
    """One quantized file: llama.cpp's file type, the type its routed experts' gate/up matrices
    must hold (the file type's own; llama.cpp moves ffn_down, attention and output elsewhere),
    and `--tensor-type` overrides (first match wins) with the exact type each must give."""
    ftype: str
    experts: T
    overrides: tuple[tuple[str, T], ...] = ()


#: Every type published MoE quants use, each through the llama.cpp file type that makes it.
CASES: dict[str, Case] = {
    "IQ1_S": Case("IQ1_S", T.IQ1_S),
    "IQ1_M": Case("IQ1_M", T.IQ1_M),
    "IQ2_XXS": Case("IQ2_XXS", T.IQ2_XXS),
    "IQ2_XS": Case("IQ2_XS", T.IQ2_XS),
    "IQ2_S": Case("IQ2_M", T.IQ2_S),
    "IQ3_XXS": Case("IQ3_XXS", T.IQ3_XXS),
    "IQ3_S": Case("IQ3_M", T.IQ3_S),
    "IQ4_NL": Case("IQ4_NL", T.IQ4_NL),
    "IQ4_XS": Case("IQ4_XS", T.IQ4_XS),
    "TQ1_0": Case("TQ1_0", T.TQ1_0),
    "TQ2_0": Case("TQ2_0", T.TQ2_0),
    "Q2_K": Case("Q2_K", T.Q2_K),
    "Q3_K": Case("Q3_K_M", T.Q3_K),
    "Q4_K": Case("Q4_K_M", T.Q4_K),
    "Q5_K": Case("Q5_K_M", T.Q5_K),
    "Q6_K": Case("Q6_K", T.Q6_K),
    "Q4_0": Case("Q4_0", T.Q4_0),
    # As Unsloth's dynamic quants: each expert matrix, layer and attention in its own type.
    "mixed": Case("IQ1_M", T.IQ1_M, (
        (r"blk\.0\.ffn_gate_exps", T.IQ2_XXS), (r"blk\.0\.ffn_up_exps", T.IQ1_S),
        (r"blk\.0\.ffn_down_exps", T.IQ3_S), (r"blk\.1\.ffn_gate_exps", T.IQ2_XS),
        (r"blk\.1\.ffn_up_exps", T.IQ3_XXS), (r"blk\.1\.ffn_down_exps", T.IQ4_XS),
        (r"blk\.0\.attn_q\.", T.IQ4_NL), (r"blk\.0\.attn_k\.", T.Q4_K), (r"blk\.0\.attn_v\.", T.Q6_K),
        (r"blk\.0\.attn_output", T.IQ2_S), (r"blk\.1\.attn_(q|k|v)\.", T.Q5_K), (r"blk\.1\.attn_output", T.TQ2_0),
        (r"token_embd", T.Q4_K), (r"output\.", T.Q6_K),
    )),
}

#: Tensor types llama.cpp's quantizer refuses to make without an importance matrix
#: (tensor_requires_imatrix in src/llama-quant.cpp, besides Q2_K in a Q2_K_S file).
NEEDS_IMATRIX = frozenset({T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS})


def imatrix_entries(path: Path) -> dict[str, np.ndarray]:
    """An imatrix file as `llama-quantize` hands it to the quantizer: per tensor name, float32
    [nmat * K] of per-expert sums / counts (1 for an expert no token reached)."""
    im, out = read_imatrix(path), {}
    for name, sums in im.sums.items():
        counts = im.counts[name].astype(np.float64).reshape(-1)
        sums = sums.astype(np.float64).reshape(counts.size, -1)
        seen = counts > 0
        mean = np.where(seen[:, None], sums / np.where(seen, counts, 1)[:, None], 1.0)
        out[name] = np.ascontiguousarray(mean, dtype=np.float32).reshape(-1)
    return out


def imatrix_metadata(imatrix: Path, n_entries: int) -> list[tuple[str, str | int]]:
    """The `quantize.imatrix.*` keys `llama-quantize --imatrix` writes."""
    im = read_imatrix(imatrix)
    return [("quantize.imatrix.file", str(imatrix)), ("quantize.imatrix.dataset", (im.datasets or [""])[0]),
            ("quantize.imatrix.entries_count", n_entries), ("quantize.imatrix.chunks_count", im.chunk_count)]


def tensor_types(path: Path) -> dict[str, T]:
    """Every tensor's type in the file, as gguf-py reads it."""
    return {t.name: T(int(t.tensor_type)) for t in GGUFReader(path).tensors}


def expected_types(case: Case, types: dict[str, T]) -> dict[str, T]:
    """The types `case` must have given: the routed experts' gate/up its file type (unless an
    override names them), each overridden tensor its override's type."""
    want = {n: case.experts for n in types if re.search(r"ffn_(gate|up)_exps", n)}
    for name in types:
        for pattern, qtype in case.overrides:
            if re.search(pattern, name):
                want[name] = qtype
                break
    return want


@torch.no_grad()
def build_tiny(root: Path) -> Tiny:
    """The fixture model (SCALES applied, weights rounded to the checkpoint's dtype) and its checkpoint."""
    spec = SPECS[ARCH]
    tok = train_byte_bpe(spec.tokenizer)
    model = build_model(spec, tok)
    for name, p in model.named_parameters():
        scale = next((f for key, f in SCALES.items() if key in name), None)
        if scale is not None:
            p.copy_((p * scale).to(spec.dtype).to(torch.float32))
    hf_dir = save_checkpoint(copy.deepcopy(model), spec, tok, root / "hf", fused=False)
    return Tiny(ARCH, spec, tok, model, hf_dir, root)


class LlamaQuantized:
    """The fixture model and its files quantized by llama.cpp, each made once (a session's)."""

    def __init__(self, root: Path):
        self.root, self._files = root, {}
        self.tiny = build_tiny(root)
        self._imatrix: Path | None = None

    @property
    def source(self) -> Path:
        return self.tiny.gguf("f32")

    def imatrix(self) -> Path:
        """Strata's importance matrix of the f32 file over 1024 tokens of corpus text, once."""
        if self._imatrix is None:
            path = self.root / f"{ARCH}.imatrix"
            collect_imatrix(self.source, " ".join(corpus(400, seed=5)), path, n_tokens=1024, n_ctx=128,
                            dataset="strata-corpus", n_threads=2, progress=False)
            self._imatrix = path
        return self._imatrix

    def file(self, key: str) -> Path:
        """The f32 file quantized by llama.cpp as CASES[key] says."""
        if key not in self._files:
            case = CASES[key]
            needs = case.experts in NEEDS_IMATRIX or any(t in NEEDS_IMATRIX for _, t in case.overrides)
            imatrix = self.imatrix() if needs or case.overrides else None
            out = self.root / f"{ARCH}-{key}.gguf"
            entries = imatrix_entries(imatrix) if imatrix is not None else None
            keys = imatrix_metadata(imatrix, len(entries)) if imatrix is not None else ()
            self._files[key] = llama_quantize(self.source, out, case.ftype, imatrix=entries, metadata=keys,
                                              overrides=case.overrides)
        return self._files[key]


__all__ = ["ARCH", "CASES", "Case", "LlamaQuantized", "NEEDS_IMATRIX", "SCALES", "build_tiny", "expected_types",
           "imatrix_entries", "imatrix_metadata", "llama_quantize", "tensor_types"]
