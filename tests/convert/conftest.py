"""Session-scoped tiny checkpoints (one per architecture, both expert layouts) and their GGUF files."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fixtures import SPECS, TRICKY, Spec, build_model, corpus, save_checkpoint, train_byte_bpe  # noqa: E402

from converters import TypePolicy, convert  # noqa: E402


@dataclass
class Tiny:
    spec: Spec
    tokenizer: object
    model: torch.nn.Module
    per_expert: Path
    fused: Path
    root: Path
    _files: dict = field(default_factory=dict)

    def gguf(self, outtype: str | None = None, source: str = "fused") -> Path:
        """The converted file (default types when `outtype` is None), converted once per session."""
        key = (outtype, source)
        if key not in self._files:
            out = self.root / f"{source}-{outtype or 'default'}.gguf"
            convert(getattr(self, source), out, TypePolicy.from_args(outtype=outtype), name="tiny", n_threads=2)
            self._files[key] = out
        return self._files[key]

    def prompt_ids(self, n: int = 160) -> list[int]:
        text = " ".join(corpus(120, seed=11))
        ids = self.tokenizer.encode(text).ids[:n]
        assert len(ids) == n
        return ids

    def logits(self, ids: list[int], model: torch.nn.Module | None = None) -> np.ndarray:
        with torch.no_grad():
            return (model or self.model)(torch.tensor([ids])).logits[0].float().numpy()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Tiny]:
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for key, spec in SPECS.items():
        tok = train_byte_bpe(spec.tokenizer)
        model = build_model(spec, tok)
        base = root / key
        per_expert = save_checkpoint(model, spec, tok, base / "per_expert", fused=False)
        fused = save_checkpoint(model, spec, tok, base / "fused", fused=True)
        out[key] = Tiny(spec, tok, model, per_expert, fused, base)
    return out


@pytest.fixture(params=list(SPECS), scope="session")
def tiny(request, tiny_models) -> Tiny:
    return tiny_models[request.param]


@pytest.fixture(scope="session")
def tricky_strings() -> list[str]:
    return TRICKY
