"""Synthetic Hugging Face checkpoints for the demo, the tests and `benchmarks/`: one builder.

`tokenizer` holds the special tokens, the chat template, the corpora and the tokenizer trainers;
`safetensors` the one safetensors writer; `checkpoint` the Qwen3-MoE checkpoints built from them
(a tiny float32 one with a trained tokenizer, and one of any size streamed shard by shard).
Nothing here is imported by the engine or the converter: this is data for exercising them.
"""
from .checkpoint import CONFIG, build_checkpoint, write_checkpoint
from .safetensors import write_safetensors
from .tokenizer import CHAT_TEMPLATE, SPECIALS, corpus, save_tokenizer, train_byte_bpe, word_corpus

__all__ = ["CHAT_TEMPLATE", "CONFIG", "SPECIALS", "build_checkpoint", "corpus", "save_tokenizer", "train_byte_bpe",
           "word_corpus", "write_checkpoint", "write_safetensors"]
