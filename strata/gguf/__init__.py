"""Validated view of a GGUF model file that addresses every routed expert as its own slab.

    mf = open_model("model.gguf")
    mf.hparams.n_experts, mf.resident, mf.expert(layer=3, expert=17, part="down")

Knows bytes and names only: numpy, gguf-py, no torch. Opening walks the header with bounds
checks (`header`), hands the file to gguf-py's memory-mapped reader, reads hyperparameters
(`hparams`) and places every expert slab (`experts`); every violation is a StrataFormatError.
A model split in parts by llama.cpp's gguf-split opens from any part (`split`): `mf.parts` lists
the files, and offsets are in one space over them.
"""
from .experts import EXPERT_TENSORS, PARTS, match_expert_tensor
from .header import SUPPORTED_VERSIONS
from .hparams import HParams, RopeScaling
from .model import ModelFile, open_model
from .records import ExpertSlab, FilePart, TensorInfo
from .routing import STRATA_ROUTING_COUNTS, STRATA_ROUTING_TOKENS

__all__ = [
    "EXPERT_TENSORS", "PARTS", "STRATA_ROUTING_COUNTS", "STRATA_ROUTING_TOKENS", "SUPPORTED_VERSIONS",
    "ExpertSlab", "FilePart", "HParams", "ModelFile", "RopeScaling", "TensorInfo",
    "match_expert_tensor", "open_model",
]
