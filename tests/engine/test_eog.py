"""Generation ends on every end-of-generation token llama.cpp would stop on: the file's EOT, its EOM,
and a token it reads as EOG by its text, not only on EOS. The tiny model's greedy path is taken
once; then one of its tokens is made EOG in the tokenizer metadata and generation must end just
before it, with finish reason "stop"."""
from __future__ import annotations

import pytest

from strata.tokenizer import Tokenizer

T = "tokenizer.ggml."
PROMPT = [11, 12, 13, 14, 15, 16]


def greedy_path(model) -> tuple[list[int], int]:
    """(the first 12 greedy tokens, the index of one that occurs there once and is no EOG yet)."""
    full = model.generate(PROMPT, temperature=0, max_tokens=12, stop_token_ids=()).token_ids
    k = next(k for k in range(2, len(full)) if full.count(full[k]) == 1 and full[k] not in model.stop_token_ids)
    return full, k


def with_eog(metadata: dict, token: int, how: str) -> Tokenizer:
    meta = dict(metadata)
    if how == "text":  # the token renamed, and the merges that made or used it dropped
        old = meta[T + "tokens"][token]
        meta[T + "tokens"] = [("<|eom_id|>" if i == token else t) for i, t in enumerate(meta[T + "tokens"])]
        meta[T + "merges"] = [m for m in meta[T + "merges"] if old not in (*m.split(" ", 1), m.replace(" ", "", 1))]
    else:
        meta[T + f"{how}_token_id"] = token
    return Tokenizer.from_metadata(meta, "eog.gguf")


@pytest.mark.parametrize("how", ["eot", "eom", "text"])
def test_generation_stops_on_each_eog_token(loaded, monkeypatch, how):
    model = loaded("qwen3moe")
    full, k = greedy_path(model)
    tok = with_eog(dict(model.model_file.metadata), full[k], how)
    assert full[k] in tok.eog_ids and model.tokenizer.eog_ids < tok.eog_ids
    monkeypatch.setattr(model, "tokenizer", tok)
    done = model.generate(PROMPT, temperature=0, max_tokens=12)
    assert done.token_ids == full[:k] and done.finish_reason == "stop"
    chunks = list(model.generate(PROMPT, temperature=0, max_tokens=12, stream=True))
    assert [c.token_id for c in chunks if c.token_id is not None] == full[:k] and chunks[-1].finish_reason == "stop"
