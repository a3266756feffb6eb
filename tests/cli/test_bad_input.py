"""Bad command-line values and inputs: one `strata: error:` line naming the flag, exit status 1.

Each value is refused where it enters (before the model loads, where it can be); the
last-resort handler turns anything else into one line, or a traceback with STRATA_DEBUG=1.
"""
from __future__ import annotations

import torch
import pytest

import strata.commands.generate as generate_cmd


def _one_error(code: int, err: str, *names: str) -> str:
    assert code == 1, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strata: error: "), err
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args, flag", [
    (["-n", "0"], "-n/--max-tokens"), (["-n", "-3"], "-n/--max-tokens"), (["--stop", ""], "--stop"),
    (["--temperature", "-1"], "--temperature"), (["--temperature", "nan"], "--temperature"),
    (["--top-p", "0"], "--top-p"), (["--top-p", "nan"], "--top-p"), (["--top-p", "2"], "--top-p"),
    (["--top-k", "-1"], "--top-k"), (["--min-p", "1.5"], "--min-p"), (["--repeat-penalty", "0"], "--repeat-penalty"),
    (["--repeat-penalty", "-1"], "--repeat-penalty"), (["--seed", str(2**70)], "--seed"), (["--seed", "-1"], "--seed"),
    (["--ctx", "0"], "--ctx"), (["--ctx", "1"], "--ctx"), (["--threads", "0"], "--threads"),
    (["--threads", "257"], "--threads"), (["--threads", "999"], "--threads"),
    (["--decoding-step-tokens", "0"], "--decoding-step-tokens"),
])
def test_generate_refuses_bad_values_by_flag(cli, qwen3, args, flag):
    code, out, err = cli("generate", qwen3.gguf(None), "-p", "Hello", *args)
    line = _one_error(code, err, flag)
    assert "expected" in line and "found" in line


def test_threads_limit_is_the_compute_pools_own(cli, qwen3):
    """--threads' range is what the native compute pool accepts: its help and its error say 256, and
    native/runtime/pool.c's POOL_MAX_THREADS is that number (the pool refused 999 after the option took it)."""
    import re
    from pathlib import Path

    from strata.defaults import MAX_THREADS

    pool_c = (Path(__file__).parents[2] / "native" / "runtime" / "pool.c").read_text()
    assert int(re.search(r"#define POOL_MAX_THREADS (\d+)", pool_c).group(1)) == MAX_THREADS == 256
    line = _one_error(*cli("generate", qwen3.gguf(None), "-p", "Hello", "--threads", "999")[::2], "--threads")
    assert "256" in line and "4096" not in line
    from strata.cli import build_parser

    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    assert "CPU threads, 1 to 256" in " ".join(generate.format_help().split())


def test_empty_prompt_is_refused(cli, qwen3):
    _one_error(*cli("generate", qwen3.gguf(None), "-p", "")[::2], "-p/--prompt")


def test_chat_refuses_bad_sampling_values(cli, qwen3):
    _one_error(*cli("chat", qwen3.gguf(None), "--top-p", "0")[::2], "--top-p")


def test_huge_context_with_direct_memory_is_refused_before_allocating(cli, qwen3):
    code, _, err = cli("generate", qwen3.gguf(None), "-p", "Hello", "--ctx", str(10**12), "--memory", "direct")
    _one_error(code, err, "n_ctx=1000000000000", "KV cache", str(qwen3.gguf(None)))


@pytest.mark.parametrize("args, names", [
    (["--memory", "paged", "--device-mem", "64M"], ("--device-mem", "--memory paged", "--host-mem")),
    (["--memory", "paged", "--prefetch-depth", "1"], ("--prefetch-depth", "--memory paged")),
    (["--memory", "paged", "--host-mem", "0"], ("--host-mem: expected a positive number of bytes", "found '0'")),
])
def test_paged_memory_refuses_what_is_not_its_own(cli, qwen3, args, names):
    _one_error(*cli("generate", qwen3.gguf(None), "-p", "Hello", *args)[::2], *names)


def test_perplexity_refuses_an_endless_file(cli, qwen3):
    _one_error(*cli("perplexity", qwen3.gguf(None), "-f", "/dev/zero")[::2], "/dev/zero", "at most")


def test_perplexity_refuses_a_missing_logits_directory_before_running(cli, qwen3, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 200)
    missing = tmp_path / "no" / "such" / "logits.pt"
    _one_error(*cli("perplexity", qwen3.gguf(None), "-f", text, "--save-logits", missing)[::2], "--save-logits",
               "does not exist")


@pytest.mark.parametrize("content", ["text", "dict without keys", "wrong types"])
def test_perplexity_refuses_a_bad_kl_divergence_base(cli, qwen3, tmp_path, content):
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 200)
    base = tmp_path / "base.pt"
    if content == "text":
        base.write_text("not a torch file")
    else:
        torch.save({} if content == "dict without keys" else
                   {"model": 1, "n_ctx": 64, "targets": [], "ppl": 1.0, "logits": torch.zeros(2, 2)}, base)
    line = _one_error(*cli("perplexity", qwen3.gguf(None), "-f", text, "--kl-divergence", base)[::2], "--kl-divergence")
    assert str(base) in line


def test_last_resort_handler_prints_one_line_and_debug_shows_the_traceback(cli, qwen3, monkeypatch):
    def broken(*args):
        raise RuntimeError("simulated bug\nsecond line")

    monkeypatch.setattr(generate_cmd, "_run", broken)
    monkeypatch.delenv("STRATA_DEBUG", raising=False)
    line = _one_error(*cli("generate", qwen3.gguf(None), "-p", "Hello")[::2], "internal error", "RuntimeError",
                      "simulated bug second line", "STRATA_DEBUG=1")
    assert line
    monkeypatch.setenv("STRATA_DEBUG", "1")
    with pytest.raises(RuntimeError, match="simulated bug"):
        cli("generate", qwen3.gguf(None), "-p", "Hello")


@pytest.mark.parametrize("command", [["generate", "-p", "hi"], ["inspect"], ["bench", "--reps", "1"], ["chat"]])
def test_a_missing_model_file_is_named_in_plain_words(cli, tmp_path, command):
    missing = tmp_path / "nope.gguf"
    line = _one_error(*cli(command[0], missing, *command[1:])[::2], str(missing))
    assert "[Errno" not in line and line.endswith(f"{missing}: no such file or directory"), line


@pytest.mark.parametrize("content, words", [
    (b"PK\x03\x04" + bytes(60), ("not a GGUF file", "b'PK\\x03\\x04'", "b'GGUF'")),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n", ("not a GGUF file", "Git LFS pointer")),
    ((80).to_bytes(8, "little") + b'{"__metadata__":{}}' + bytes(60), ("not a GGUF file", "safetensors")),
])
def test_a_file_that_is_not_gguf_says_so(cli, tmp_path, content, words):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(content)
    line = _one_error(*cli("inspect", bad)[::2], str(bad), *words)
    assert "magic" not in line


def test_a_checkpoint_folder_points_to_the_converter(cli, tmp_path):
    _one_error(*cli("generate", tmp_path, "-p", "hi")[::2], str(tmp_path), "a folder, not a GGUF file",
               "python -m strata.convert")


def test_os_errors_read_as_sentences():
    from strata.commands.errors import os_error_text

    assert os_error_text(FileNotFoundError(2, "No such file or directory", "m.gguf")) == "m.gguf: no such file or directory"
    assert os_error_text(OSError(28, "No space left on device")) == "no space left on device"
    assert os_error_text(OSError("plain")) == "plain"
