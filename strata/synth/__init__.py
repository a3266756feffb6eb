"""Synthetic Hugging Face checkpoints for the demo, the tests and `benchmarks/`: one builder.

`tokenizer` holds the special tokens, the chat template, the corpora and the tokenizer trainers;
`safetensors` the one safetensors writer; `checkpoint` the Qwen3-MoE checkpoints built from them
(a tiny float32 one with a trained tokenizer, and one of any size streamed shard by shard).
Nothing here is imported by the engine or the converter: this is data for exercising them.
"""
import importlib
from typing import Any

#: Public name -> the submodule that defines it. Imported on first use (PEP 562), so that
#: `strata.synth.presets` (the `strata synth --help` text) loads without numpy.
_EXPORTS = {"CONFIG": "checkpoint", "build_checkpoint": "checkpoint", "write_checkpoint": "checkpoint",
            "write_safetensors": "safetensors", "CHAT_TEMPLATE": "tokenizer", "SPECIALS": "tokenizer",
            "corpus": "tokenizer", "save_tokenizer": "tokenizer", "train_byte_bpe": "tokenizer",
            "word_corpus": "tokenizer"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'strata.synth' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)

__all__ = ["CHAT_TEMPLATE", "CONFIG", "SPECIALS", "build_checkpoint", "corpus", "save_tokenizer", "train_byte_bpe",
           "word_corpus", "write_checkpoint", "write_safetensors"]
