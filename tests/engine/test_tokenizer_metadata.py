"""Tokenizer metadata from a hostile file is checked before it is used: lengths against the
output head, element types, merges, byte tokens, special ids and UTF-8, each refused with a
StrataFormatError naming the file and the key."""
from __future__ import annotations

import pytest

import strata
from strata.errors import StrataFormatError
from strata.gguf import open_model
from strata.tokenizer import Tokenizer
from tests.fixtures.rewrite import V, patch_string, rewrite

T = "tokenizer.ggml."


@pytest.fixture(scope="module")
def bpe(tiny_qwen3):
    with open_model(tiny_qwen3) as mf:
        return dict(mf.metadata)


@pytest.fixture(scope="module")
def tiny_qwen3():
    from tests.fixtures.tiny import zoo
    return zoo().get("qwen3moe").gguf(None)


def spm_metadata() -> dict:
    """A small SentencePiece ('llama') tokenizer: specials, 256 byte tokens, a few pieces."""
    pieces = ["\u2581", "\u2581a", "a", "b", "\u2581ab", "ab"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, 3, 3, *[6] * 256, *[1] * len(pieces)]
    return {T + "model": "llama", T + "tokens": tokens, T + "token_type": types,
            T + "scores": [0.0] * 259 + [-float(i) for i in range(len(pieces))], T + "bos_token_id": 1,
            T + "eos_token_id": 2, T + "unknown_token_id": 0}


def test_valid_metadata_builds():
    tok = Tokenizer.from_metadata(spm_metadata(), "spm.gguf", vocab_size=265)
    ids = tok.encode("ab a")
    assert [tok.tokens[i] for i in ids] == ["<s>", "\u2581ab", "\u2581a"]
    assert tok.decode(ids[1:]) == "ab a"


def _refused(meta: dict, key: str, vocab_size: int | None, *found: str) -> None:
    with pytest.raises(StrataFormatError) as e:
        Tokenizer.from_metadata(meta, "bad.gguf", vocab_size=vocab_size)
    msg = str(e.value)
    assert msg.startswith("bad.gguf: ") and repr(key) in msg and "expected" in msg, msg
    for f in found:
        assert f in msg, msg


@pytest.mark.parametrize("change, key, found", [
    (lambda m: m[T + "token_type"].pop(), T + "token_type", "264 values"),
    (lambda m: m[T + "scores"].append(0.0), T + "scores", "266 values"),
    (lambda m: m[T + "token_type"].__setitem__(5, 42), T + "token_type", "42 at index 5"),
    (lambda m: m[T + "token_type"].__setitem__(5, "1"), T + "token_type", "'1' at index 5"),
    (lambda m: m[T + "scores"].__setitem__(7, float("nan")), T + "scores", "nan at index 7"),
    (lambda m: m[T + "tokens"].__setitem__(10, "<0xZZ>"), T + "tokens", "'<0xZZ>' (token 10, type BYTE)"),
    (lambda m: m[T + "tokens"].__setitem__(10, "<0x100>"), T + "tokens", "token 10"),
    (lambda m: m.__setitem__(T + "bos_token_id", 265), T + "bos_token_id", "265"),
    (lambda m: m.__setitem__(T + "eos_token_id", -1), T + "eos_token_id", "-1"),
    (lambda m: m.__setitem__(T + "eos_token_id", "2"), T + "eos_token_id", "'2'"),
    (lambda m: m.__setitem__(T + "unknown_token_id", True), T + "unknown_token_id", "True"),
    (lambda m: m.__setitem__(T + "add_bos_token", 1), T + "add_bos_token", "a bool"),
    (lambda m: m[T + "tokens"].__setitem__(262, "\udcff"), T + "tokens", "invalid UTF-8 at index 262"),
    (lambda m: m[T + "tokens"].__setitem__(262, 7), T + "tokens", "int at index 262"),
    (lambda m: m.__setitem__(T + "tokens", "abc"), T + "tokens", "str"),
])
def test_spm_metadata_refused(change, key, found):
    meta = spm_metadata()
    meta = {k: list(v) if isinstance(v, list) else v for k, v in meta.items()}
    change(meta)
    _refused(meta, key, None, found)


@pytest.mark.parametrize("delta", [-1, 1])
def test_token_count_must_match_the_output_head(bpe, delta):
    n = len(bpe[T + "tokens"])
    _refused(bpe, T + "tokens", n + delta, f"expected {n + delta} tokens", f"found {n}")


@pytest.mark.parametrize("merge", ["zzq qqz", "nospace", " x", 17, "h\udcffe"])
def test_bad_merges_refused(bpe, merge):
    meta = dict(bpe)
    meta[T + "merges"] = [merge, *bpe[T + "merges"]]
    _refused(meta, T + "merges", None, "index 0")


def test_load_refuses_a_file_whose_tokens_do_not_match_the_head(tiny_qwen3, tmp_path):
    tokens = open_model(tiny_qwen3).metadata[T + "tokens"]
    bad = rewrite(tiny_qwen3, tmp_path / "short.gguf", {T + "tokens": (tokens[:-1], V.ARRAY, V.STRING)})
    with pytest.raises(StrataFormatError, match=r"short.gguf: metadata key 'tokenizer.ggml.tokens': expected 600"):
        strata.load(bad, threads=1, n_ctx=32)


def test_load_refuses_a_token_with_a_flipped_byte(tiny_qwen3, tmp_path):
    bad = tmp_path / "flip.gguf"
    bad.write_bytes(tiny_qwen3.read_bytes())
    patch_string(bad, b"the", b"\xffhe")
    with pytest.raises(StrataFormatError, match=r"flip.gguf: metadata key 'tokenizer.ggml.tokens': expected valid "
                                                r"UTF-8 strings, found invalid UTF-8 at index"):
        strata.load(bad, threads=1, n_ctx=32)
