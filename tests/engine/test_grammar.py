"""Grammars enforced while sampling: a tiny random model at temperature 1 writes garbage unless the
mask holds it, so every output parsing and validating tests the mask itself."""
from __future__ import annotations

import json

import pytest

jsonschema = pytest.importorskip("jsonschema")

import strata  # noqa: E402
from strata.engine.config import OptionError  # noqa: E402
from strata.engine.grammar import Grammar  # noqa: E402
from strata.engine.sampling import SamplingParams  # noqa: E402
from tests.fixtures.tiny import zoo  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "kind": {"enum": ["cat", "dog", "bird"]},
    "grid": {"type": "array", "maxItems": 3, "items": {"type": "array", "maxItems": 3,
                                                        "items": {"type": "integer", "minimum": 0, "maximum": 99}}},
    "ok": {"type": "boolean"}},
    "required": ["name", "kind", "grid", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def model():
    with strata.load(zoo().get("qwen3moe").gguf("f32"), threads=1) as m:
        yield m


def _quote_bias(model) -> dict[int, float]:
    """Tokens that close a JSON string, favoured so a random model's strings end within the budget."""
    return {i: 8.0 for i, b in enumerate(model.tokenizer.token_bytes) if b in (b'"', b'",', b'"}', b'":')}


@pytest.mark.parametrize("seed", range(4))
def test_json_schema_output_validates(model, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
    c = model.generate("Describe a pet", grammar=fmt, temperature=1.0, top_k=0, seed=seed, max_tokens=160)
    assert c.finish_reason == "stop"
    value = json.loads(c.text)
    jsonschema.validate(value, SCHEMA)
    assert list(value) == ["name", "kind", "grid", "ok"]  # the schema's order, as strict mode writes it


def test_unconstrained_output_is_not_json(model):
    """The control: the same sampling without the grammar does not give JSON."""
    c = model.generate("Describe a pet", temperature=1.0, top_k=0, seed=0, max_tokens=40)
    with pytest.raises(json.JSONDecodeError):
        json.loads(c.text)


@pytest.mark.parametrize("seed", range(3))
def test_json_object_mode(model, seed):
    c = model.generate("{", grammar={"type": "json_object"}, temperature=1.0, top_k=0, seed=seed,
                       max_tokens=200, logit_bias=_quote_bias(model))
    assert c.finish_reason == "stop", c.text
    assert isinstance(json.loads(c.text), dict)


def test_gbnf_grammar(model):
    gbnf = 'root ::= ("yes" | "no") " " [0-9] [0-9]?'
    for seed in range(3):
        c = model.generate("answer", grammar=gbnf, temperature=1.0, top_k=0, seed=seed, max_tokens=20)
        assert c.finish_reason == "stop"
        word, number = c.text.split(" ")
        assert word in ("yes", "no") and number.isdigit() and len(number) <= 2


def test_grammar_ends_even_when_eos_is_ignored(model):
    """A complete grammar forces the end token; with no stop tokens the sequence still ends there."""
    c = model.generate("x", grammar='root ::= "done"', stop_token_ids=[], temperature=1.0, seed=1, max_tokens=20)
    assert (c.text, c.finish_reason) == ("done", "stop")


def test_batched_rows_keep_their_own_grammar(model):
    """A constrained row beside an unconstrained one in one batch: only its row is masked."""
    free, bound = model.generate_batch(["a", "b"], temperature=1.0, top_k=0, seed=3, max_tokens=12)
    assert free.text and bound.text
    outs = model._run([model._sequence("a", SamplingParams(temperature=1.0, top_k=0, seed=3, max_tokens=12)),
                       model._sequence("b", SamplingParams(temperature=1.0, top_k=0, seed=3, max_tokens=12,
                                                           grammar='root ::= "ok"'))])
    assert outs[0].text == free.text and outs[1].text == "ok"


@pytest.mark.parametrize("schema, match", [({"type": "objectx"}, "objectx"),
                                            ({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}, "nope"),
                                            ({"type": "string", "pattern": "(?<=a)b"}, "regex")])
def test_uncompilable_schema_is_refused(schema, match):
    with pytest.raises(OptionError, match=f"grammar: the grammar engine cannot compile it.*{match}"):
        SamplingParams(grammar={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def test_bad_gbnf_is_refused():
    with pytest.raises(OptionError, match="grammar: "):
        SamplingParams(grammar="root ::= undefined_rule")


def test_params_with_a_grammar_stay_hashable():
    a = SamplingParams(grammar={"type": "json_object"})
    b = SamplingParams(grammar=Grammar.json_object())
    assert a == b and hash(a) == hash(b) and SamplingParams(grammar={"type": "text"}).grammar is None


def test_masking_does_not_import_torch_compile():
    """llguidance.torch compiles a kernel at import (torch._dynamo: seconds on the first constrained
    request): the mask is filled without it, and still matches llguidance's own mask."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from strata.engine.grammar import Grammar, Matcher, apply_masks, vocabulary\n"
        "import strata\n"
        "m = strata.load(sys.argv[1], threads=1)\n"
        "matcher = Matcher(Grammar('gbnf', 'root ::= \"{\" [a-z]* \"}\"'), m.prepare_grammar())\n"
        "logits = torch.zeros(2, m.tokenizer.vocab_size)\n"
        "apply_masks(logits, [1], [matcher])\n"
        "allowed = set(torch.nonzero(logits[1] == 0).flatten().tolist())\n"
        "mask = matcher.ll.compute_logit_bias()\n"
        "assert allowed == {i for i in range(m.tokenizer.vocab_size) if mask[i]}, 'mask differs'\n"
        "assert (logits[0] == 0).all() and 0 < len(allowed) < m.tokenizer.vocab_size\n"
        "print(sorted(k for k in sys.modules if k.startswith(('torch._dynamo', 'llguidance.torch'))))\n")
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    path = zoo().get("qwen3moe").gguf("f32")  # built here: the fixture builder imports transformers
    out = subprocess.run([sys.executable, "-c", code, str(path)], cwd=root, capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_vocabulary_is_built_once_for_concurrent_callers(monkeypatch, model):
    import threading

    from strata.engine import grammar

    built = []
    real = grammar.Vocabulary.__init__

    def counting(self, *a):
        built.append(threading.current_thread().name)
        real(self, *a)

    monkeypatch.setattr(grammar.Vocabulary, "__init__", counting)
    monkeypatch.setattr(grammar, "_VOCABULARIES", grammar.weakref.WeakKeyDictionary())
    assert not model.grammar_ready
    got = []
    threads = [threading.Thread(target=lambda: got.append(model.prepare_grammar())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and len({id(v) for v in got}) == 1 and model.grammar_ready
