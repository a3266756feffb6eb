"""The tokenizer rebuilt from GGUF metadata equals the source Hugging Face tokenizer."""
from __future__ import annotations

import gguf
import pytest
from gguf import GGUFReader
from tokenizers import Regex, pre_tokenizers
from transformers import AutoTokenizer

from converters.tokenizer import PRE_TOKENIZERS, write_tokenizer
from strata.errors import StrataFormatError
from strata.gguf import open_model
from strata.tokenizer import PRE_TOKENIZER_REGEXES, Tokenizer
from tests.fixtures.tiny import TRICKY

from .spm_fixture import build_spm_tokenizer

MORE = ["", " ", "\n", "a", "  \n\n  x", "\u00a0non-breaking\u00a0space", "tab\t\tdouble", "ÀÉÎÕÜ", "🦙" * 3,
        "<|im_end|><|im_end|>", "<|im_start|", "don't DON'T", "x" * 300, "1234567890123"]


def _hf(folder):
    return AutoTokenizer.from_pretrained(folder)


def test_byte_level_bpe_equals_source_tokenizer(tiny):
    tok = Tokenizer.from_metadata(open_model(tiny.gguf("f32")).metadata)
    hf = _hf(tiny.hf_dir)
    for s in TRICKY + MORE:
        ids = tok.encode(s)
        assert ids == hf.encode(s), repr(s)
        assert tok.decode(ids) == hf.decode(ids), repr(s)
        assert tok.decode(ids, skip_special=True) == hf.decode(ids, skip_special_tokens=True), repr(s)


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spm")
    source = build_spm_tokenizer(folder)
    w = gguf.GGUFWriter(str(folder / "tok.gguf"), "llama")
    write_tokenizer(w, folder, source.get_vocab_size())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    meta = {k: f.contents() for k, f in GGUFReader(folder / "tok.gguf").fields.items() if not k.startswith("GGUF.")}
    return Tokenizer.from_metadata(meta), _hf(folder)


def test_sentencepiece_llama_equals_source_tokenizer(spm):
    tok, hf = spm
    assert tok.kind == "llama" and tok.special.add_bos
    for s in TRICKY + MORE + ["Hello <s> world</s>", "日本語 🦙 byte fallback"]:
        ids = tok.encode(s)
        assert ids == hf.encode(s), repr(s)
        assert tok.decode(ids) == hf.decode(ids), repr(s)
    assert any(tok.types[i] == gguf.TokenType.BYTE for i in tok.encode("𝔘"))  # via byte fallback


def test_streaming_never_splits_a_character(spm):
    tok, _ = spm
    text = "naïve 日本語 𝔘𝔙 and 👩‍👩‍👧 done"
    ids = tok.encode(text, add_special=False)
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == " " + text  # a continuation keeps SentencePiece's prefixed space
    assert all("\ufffd" not in p for p in pieces)
    assert sum(1 for p in pieces if p == "") >= 3  # multi-byte characters were held back


def _pieces(regexes, text: str) -> list[str]:
    seq = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes])
    return [piece for piece, _ in seq.pre_tokenize_str(text)]


def test_pre_tokenizer_names_agree_with_the_converter():
    """The name the converter writes for a tokenizer.json regex splits text as that regex does
    (llama.cpp spells the regexes differently: same pieces)."""
    for regex, name in PRE_TOKENIZERS.items():
        for s in TRICKY + MORE + ["don'T 'S 'Ll", "x\u2003\u3000 y\n\n z  "]:
            assert _pieces(PRE_TOKENIZER_REGEXES[name], s) == _pieces([regex], s), (name, s)


def test_parse_special_off_spells_special_text_out(tiny):
    tok = Tokenizer.from_metadata(open_model(tiny.gguf("f32")).metadata)
    hf = _hf(tiny.hf_dir)
    text = "<|im_start|>user"
    assert tok.encode(text)[0] == hf.convert_tokens_to_ids("<|im_start|>")
    spelled = tok.encode(text, parse_special=False)
    assert hf.convert_tokens_to_ids("<|im_start|>") not in spelled and tok.decode(spelled) == text


def test_unknown_pre_tokenizer_is_a_format_error(tiny):
    meta = dict(open_model(tiny.gguf("f32")).metadata)
    meta["tokenizer.ggml.pre"] = "no-such-pre"
    with pytest.raises(StrataFormatError, match="no-such-pre"):
        Tokenizer.from_metadata(meta, "x.gguf")
