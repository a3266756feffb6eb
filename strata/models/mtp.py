"""Multi-token-prediction (nextn) layers: read from the file and kept on the model, never run by it.

A file may carry `nextn_predict_layers` blocks after the trunk (llama.cpp's `blk.N.nextn.*`):
each a whole decoder block plus the projections of a draft head, which llama.cpp runs as
    h' = block(eh_proj [enorm(embed(token)) | hnorm(h)]);  logits = head(head_norm(h'))
with the model's embeddings, head and output norm where the layer has none of its own. Neither
llama.cpp's main graph nor `Transformer.forward` runs them; a speculative decoder will. Here they
are read and checked: the projections as tensors of the compute dtype, the decoder block's own
tensors (attention, norms, router, experts) as the file's records (`ModelFile.mtp`), their bytes
left in the map. A file that declares the layers without their tensors (a trunk whose draft head
lives in another file) has none, as llama.cpp's loader reads it.
Must not: run them, or reach expert bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from gguf.constants import MODEL_TENSOR as MT

from strata.arch import layer_of, weight_name

#: The draft head's own tensors (the rest of an MTP layer is an ordinary decoder block).
NEXTN = (MT.NEXTN_EH_PROJ, MT.NEXTN_ENORM, MT.NEXTN_HNORM, MT.NEXTN_SHARED_HEAD_NORM, MT.NEXTN_EMBED_TOKENS,
         MT.NEXTN_SHARED_HEAD_HEAD)


@dataclass
class NextN:
    """One multi-token-prediction layer of the file: block `layer` (the trunk's n_layers + k)."""

    layer: int
    eh_proj: torch.Tensor  # [D, 2D]: [enorm(embedding) | hnorm(hidden)] -> the block's input
    enorm: torch.Tensor  # [D]
    hnorm: torch.Tensor  # [D]
    head_norm: torch.Tensor | None = None  # [D] shared_head_norm; None: the model's output norm
    embedding: torch.Tensor | None = None  # [V, D] embed_tokens; None: the model's embeddings
    head: torch.Tensor | None = None  # [V, D] shared_head_head; None: the model's output head
    block: dict = field(default_factory=dict)  # name -> TensorInfo of the decoder block's tensors


def read_nextn(w, hp) -> list[NextN]:
    """The multi-token-prediction layers of `w`'s file (a loader `WeightReader`), none when the file
    has none or declares them without their tensors; a missing or mis-shaped projection is an
    error naming the tensor."""
    mtp = w.mf.mtp
    first = hp.n_layers
    if not hp.n_layers_nextn or weight_name(MT.NEXTN_EH_PROJ, first) not in mtp:
        return []
    D, V = hp.n_embd, hp.vocab_size
    layers = []
    for i in range(first, first + hp.n_layers_nextn):
        own = {weight_name(kind, i) for kind in NEXTN}
        layers.append(NextN(
            i, w.get(MT.NEXTN_EH_PROJ, i, (D, 2 * D)), w.get(MT.NEXTN_ENORM, i, (D,)), w.get(MT.NEXTN_HNORM, i, (D,)),
            head_norm=w.opt(MT.NEXTN_SHARED_HEAD_NORM, i, (D,)), embedding=w.opt(MT.NEXTN_EMBED_TOKENS, i, (V, D)),
            head=w.opt(MT.NEXTN_SHARED_HEAD_HEAD, i, (V, D)),
            block={name: t for name, t in mtp.items() if layer_of(name) == i and name not in own}))
    return layers


__all__ = ["NEXTN", "NextN", "read_nextn"]
