"""Small tokenizer metadata built on the spot for the tokenizer tests."""
from __future__ import annotations

from gguf.constants import TokenType

from strata.tokenizer import bytes_to_unicode

T = "tokenizer.ggml."
BYTES = list(bytes_to_unicode().values())


def byte_level_metadata(extra_tokens: list[str] = (), **keys) -> dict:
    """A byte-level BPE vocabulary: the 256 byte characters, 'ab' (merge 'a b'), then
    `extra_tokens` (CONTROL); `keys` are further tokenizer.ggml.* keys."""
    tokens = [*BYTES, "ab", *extra_tokens]
    types = [TokenType.NORMAL] * 257 + [TokenType.CONTROL] * len(extra_tokens)
    return {T + "model": "gpt2", T + "pre": "qwen2", T + "tokens": tokens, T + "token_type": types,
            T + "merges": ["a b"], **{T + k: v for k, v in keys.items()}}
