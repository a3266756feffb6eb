"""`strata generate` and `strata perplexity` against the Python API, and the error lines."""
from __future__ import annotations

import json

import pytest

import strata
from tests.convert.fixtures import corpus
from tests.gguf import fixtures as gguf_fixtures


def test_generate_json_equals_the_api(cli, qwen3):
    code, out, _ = cli("generate", qwen3.gguf("f32"), "-p", "the expert router", "-n", "12", "--json",
                       "--threads", "1", "--temp", "0")
    got = json.loads(out)
    ref = strata.load(qwen3.gguf("f32"), threads=1).generate("the expert router", temperature=0, max_tokens=12)
    assert code == 0 and got["token_ids"] == ref.token_ids and got["text"] == ref.text
    assert got["tokens_per_second"] > 0


def test_generate_streams_prompt_and_text(cli, qwen3):
    code, out, err = cli("generate", qwen3.gguf("f32"), "-p", "a model", "-n", "6", "--temperature", "0.7",
                         "--seed", "3", "--threads", "1")
    ref = strata.load(qwen3.gguf("f32"), threads=1).generate("a model", max_tokens=6, temperature=0.7, seed=3)
    assert code == 0 and out == "a model" + ref.text + "\n"
    assert "6 tokens" in err and "tok/s" in err


def test_perplexity_save_logits_and_kl_divergence(cli, qwen3, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(corpus(120, seed=4)), encoding="utf-8")
    saved = tmp_path / "f32.logits"
    code, out, _ = cli("perplexity", qwen3.gguf("f32"), "-f", text, "--ctx", "64", "--json", "--save-logits", saved,
                       "--threads", "1")
    base = json.loads(out)
    m = strata.load(qwen3.gguf("f32"), threads=1, n_ctx=64)
    assert code == 0 and base["ppl"] == pytest.approx(m.perplexity(m.tokenize(text.read_text()), 64).ppl, rel=1e-9)
    code, out, _ = cli("perplexity", qwen3.gguf("q8_0"), "-f", text, "--ctx", "64", "--json",
                       "--kl-divergence", saved, "--threads", "1")
    q8 = json.loads(out)
    kl = q8["kl_divergence"]
    assert code == 0 and q8["base"]["ppl"] == base["ppl"] and base["n_chunks"] >= 2
    assert 0 < kl["kl_mean"] < 0.01 and kl["top1_agreement"] >= 0.9
    code, out, _ = cli("perplexity", qwen3.gguf("q8_0"), "-f", text, "--ctx", "64", "--kl-divergence", saved,
                       "--threads", "1")
    assert code == 0 and "Final estimate: PPL = " in out and "top-1 agreement" in out


def test_perplexity_batch_size(cli, qwen3, tmp_path):
    """-b 1 scores one token per pass: the API's figure with batch_size=1, close to one pass's."""
    text = tmp_path / "text.txt"
    text.write_text(" ".join(corpus(80, seed=5)), encoding="utf-8")
    args = ("perplexity", qwen3.gguf("q8_0"), "-f", text, "--ctx", "32", "--json", "--threads", "1")
    (code, whole, _), (code1, one, _) = cli(*args), cli(*args, "-b", "1")
    a, b = json.loads(whole), json.loads(one)
    assert code == code1 == 0 and b["n_scored"] == a["n_scored"] > 0
    assert b["ppl"] == pytest.approx(a["ppl"], rel=1e-3)
    with strata.load(qwen3.gguf("q8_0"), threads=1, n_ctx=32) as m:
        assert b["ppl"] == pytest.approx(m.perplexity(m.tokenize(text.read_text()), 32, batch_size=1).ppl, rel=1e-9)


def _one_error_line(code: int, err: str, needle: str) -> None:
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("strata: error: ") and needle in lines[0], err


def test_unsupported_architecture_is_one_line(cli, tmp_path):
    """A file of an architecture Strata reads but does not run (its record says runs=False)."""
    import dataclasses

    from strata import arch
    path = tmp_path / "deepseek.gguf"
    gguf_fixtures.write_deepseek2(path)
    record = arch.get("deepseek2")
    arch.unregister("deepseek2")
    arch.register(dataclasses.replace(record, runs=False))
    try:
        code, _, err = cli("generate", path, "-p", "hi")
    finally:
        arch.unregister("deepseek2")
        arch.register(record)
    _one_error_line(code, err, "architecture 'deepseek2' is not supported")


def test_prompt_longer_than_context_is_one_line(cli, qwen3):
    code, _, err = cli("generate", qwen3.gguf("f32"), "-p", " ".join(["the expert"] * 40), "--ctx", "16")
    _one_error_line(code, err, "does not fit the context of 16 tokens")


@pytest.mark.parametrize("device", ["tpu", "gpu0"])
def test_unknown_device_is_one_line(cli, qwen3, device):
    code, _, err = cli("generate", qwen3.gguf("f32"), "-p", "hi", "--device", device)
    _one_error_line(code, err, f"unknown device {device!r}")


def test_missing_file_is_one_line(cli, tmp_path):
    code, _, err = cli("chat", tmp_path / "nope.gguf")
    _one_error_line(code, err, "nope.gguf")


@pytest.mark.parametrize("compute", ["packed", "float"])
def test_generate_compute_flag_and_time_split(cli, qwen3, compute):
    code, out, err = cli("generate", qwen3.gguf(None), "-p", "the expert router", "-n", "8", "--json",
                         "--threads", "1", "--compute", compute, "--stats", "--temp", "0")
    ref = strata.load(qwen3.gguf(None), threads=1, compute=compute).generate("the expert router", temperature=0,
                                                                             max_tokens=8)
    assert code == 0 and json.loads(out)["token_ids"] == ref.token_ids
    line = next(x for x in err.splitlines() if x.startswith("time per token"))
    parts = dict(p.rsplit(" ", 1) for p in line.split(": ", 1)[1].split(", "))
    assert set(parts) == {"attention", "expert compute", "expert wait", "dequantization", "other"}
    assert float(parts["attention"]) > 0 and float(parts["expert compute"]) > 0
    assert (float(parts["dequantization"]) == 0) == (compute == "packed")  # packed slots are never dequantized
    plan = next(x for x in err.splitlines() if x.startswith("runtime: "))
    assert plan.startswith("runtime: decode: program; prefill: packed per-call; hybrid: off; memory: direct — why: "
                           "decode: " if compute == "packed" else
                           "runtime: decode: float; prefill: float; hybrid: off; memory: tiered — why: ")


def test_engine_flags_reach_the_engine(cli, qwen3, monkeypatch):
    """--max-step-tokens and --kv-blocks size the scheduler and the KV pool; a 16-token prompt in
    two chunks of 8 gives the tokens of one whole prefill; a pool below one --ctx sequence is one
    error line naming it."""
    seen = {}
    real_load = strata.load

    def spy(path, **kwargs):
        seen.update(kwargs)
        return real_load(path, **kwargs)

    monkeypatch.setattr(strata, "load", spy)
    prompt = " ".join(corpus(40, seed=2))[:60]
    code, out, err = cli("generate", qwen3.gguf("f32"), "-p", prompt, "-n", "6", "--json", "--threads", "1",
                       "--ctx", "128", "--max-step-tokens", "8", "--kv-blocks", "9", "--temp", "0")
    assert code == 0 and seen["max_step_tokens"] == 8 and seen["kv_blocks"] == 9, err
    ref = real_load(qwen3.gguf("f32"), threads=1, n_ctx=128).generate(prompt, temperature=0, max_tokens=6)
    assert json.loads(out)["token_ids"] == ref.token_ids
    code, _, err = cli("generate", qwen3.gguf("f32"), "-p", "hi", "--ctx", "128", "--kv-blocks", "7")
    _one_error_line(code, err, "kv_blocks=7")
