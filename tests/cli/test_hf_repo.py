"""`-hf USER/REPO[:QUANT]` against a Hugging Face hub cache built here (no download, HF_HUB_OFFLINE=1).

The cache is laid out as huggingface_hub writes it: `models--USER--REPO/blobs/<sha256>`,
`refs/main` holding the commit, `snapshots/<commit>/<path>` relative symlinks to the blobs.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

import strata
from strata import hub
from strata.cli import build_parser
from strata.commands.bench import normalize_argv
from strata.errors import StrataArgumentError, StrataError
from tests.gguf.split_fixture import split_gguf, tensor_cuts

PROMPT = "the expert router"


def lay_out(cache: Path, repo_id: str, files: dict[str, Path]) -> Path:
    """Put `files` (repository path -> local file) in `cache` as huggingface_hub caches a download
    of `repo_id` at its main revision; the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)  # no newline, as huggingface_hub writes it
    snapshot = repo / "snapshots" / commit
    for name, src in files.items():
        data = src.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """An empty hub cache, HF_HUB_OFFLINE=1 and HF_HUB_CACHE set for this process (huggingface_hub
    read them at import: its constants are set too) and its children; sockets refuse to connect."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    for name, value in (("HF_HUB_OFFLINE", "1"), ("HF_HUB_CACHE", str(cache)), ("HF_HOME", str(tmp_path / "hf"))):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))

    def no_network(self, address):
        raise AssertionError(f"a test of -hf tried to connect to {address}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    return cache


@pytest.fixture(scope="module")
def split_parts(qwen3, tmp_path_factory) -> list[Path]:
    src = qwen3.gguf("q8_0")
    return split_gguf(src, tmp_path_factory.mktemp("split") / "Tiny-Q8_0", tensor_cuts(src, 3))


@pytest.fixture
def repos(offline, qwen3, split_parts, tmp_path):
    """test/tiny-GGUF: one Q8_0 file beside a projector and a readme; test/tiny-split-GGUF: the same
    model in three parts in a Q8_0 folder."""
    readme = tmp_path / "README.md"
    readme.write_text("a tiny model\n")
    lay_out(offline, "test/tiny-GGUF", {"README.md": readme, "Tiny-Q8_0.gguf": qwen3.gguf("q8_0"),
                                        "mmproj-Tiny-F16.gguf": readme})
    lay_out(offline, "test/tiny-split-GGUF", {f"Q8_0/{p.name}": p for p in split_parts})
    return offline


def _strata(env_python, subprocess_env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([env_python, "-m", "strata", *args], env=dict(subprocess_env, **_hf_env()),
                          capture_output=True, text=True, timeout=300)


def _hf_env() -> dict[str, str]:
    return {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_HOME")}


def _reference(path: Path, n: int):
    with strata.load(path, threads=1) as m:
        return m.generate(PROMPT, temperature=0, max_tokens=n)


# -- the command line ---------------------------------------------------------------------------


def test_generate_from_a_cached_repository(repos, qwen3, python, subprocess_env):
    """`strata generate -hf test/tiny-GGUF:Q8_0` in a process of its own, offline: the cached file's text."""
    out = _strata(python, subprocess_env, "generate", "-hf", "test/tiny-GGUF:Q8_0", "-p", PROMPT, "-n", "6",
                  "--temp", "0", "--threads", "1")
    ref = _reference(qwen3.gguf("q8_0"), 6)
    assert out.returncode == 0, out.stderr
    assert len(ref.token_ids) == 6 and out.stdout == PROMPT + ref.text + "\n"
    assert "6 tokens" in out.stderr


def test_generate_from_split_parts(repos, qwen3, python, subprocess_env):
    """A lower-case quant picks the split model in its folder; all three parts load as one model."""
    out = _strata(python, subprocess_env, "generate", "-hf", "test/tiny-split-GGUF:q8_0", "-p", PROMPT, "-n", "6",
                  "--temp", "0", "--threads", "1", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["token_ids"] == _reference(qwen3.gguf("q8_0"), 6).token_ids


def test_a_missing_quant_lists_those_present(repos, cli):
    code, out, err = cli("generate", "-hf", "test/tiny-GGUF:Q5_K_M", "-p", PROMPT)
    assert (code, out) == (1, "")
    assert err == "strata: error: test/tiny-GGUF has no Q5_K_M file; it has: Q8_0\n"


def test_a_path_and_hf_together_are_refused(repos, cli, qwen3, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(PROMPT)
    for command in (("generate", "-p", PROMPT), ("inspect",), ("perplexity", "-f", text), ("bench", "-n", "1")):
        code, out, err = cli(command[0], qwen3.gguf("q8_0"), "-hf", "test/tiny-GGUF:Q8_0", *command[1:])
        assert (code, out) == (1, ""), command
        assert err.startswith("strata: error: give a MODEL file or -hf test/tiny-GGUF:Q8_0, not both (")
        assert err.count("\n") == 1


def test_chat_takes_hf_or_server_not_both(cli):
    code, _, err = cli("chat", "-hf", "u/r:Q8_0", "--server", "127.0.0.1:9")
    assert (code, err) == (1, "strata: error: strata chat: give a MODEL file or --server URL, not both (u/r:Q8_0)\n")


def test_neither_a_path_nor_hf_is_one_line(cli):
    code, _, err = cli("generate", "-p", PROMPT)
    assert (code, err) == (1, "strata: error: expected a MODEL file or -hf USER/REPO[:QUANT]\n")


def test_offline_with_nothing_cached(offline, cli):
    code, _, err = cli("generate", "-hf", "someone/absent-GGUF", "-p", PROMPT)
    assert code == 1
    assert err == f"strata: error: someone/absent-GGUF: not in the cache ({offline}) and HF_HUB_OFFLINE is set\n"


def test_a_bad_spec_is_one_line(offline, cli):
    code, _, err = cli("generate", "-hf", "no-slash", "-p", PROMPT)
    assert code == 1 and err.startswith("strata: error: -hf 'no-slash': expected USER/REPO[:QUANT]")
    assert err.count("\n") == 1


def test_inspect_takes_hf(repos, cli):
    code, out, _ = cli("inspect", "-hf", "test/tiny-split-GGUF:Q8_0", "--json")
    summary = json.loads(out)
    assert code == 0 and summary["arch"] == "qwen3moe" and len(summary["parts"]) == 3


MODEL_COMMANDS = [("generate", "-p", "x"), ("chat",), ("serve",), ("perplexity", "-f", "t"), ("inspect",),
                  ("imatrix", "-f", "t", "-o", "o"), ("bench", "model"), ("bench", "tiered"), ("bench", "ladder"),
                  ("bench", "pager")]


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=" ".join)
def test_every_model_command_takes_hf(command):
    for flag in ("-hf", "--hf-repo"):
        args = build_parser().parse_args([*command, flag, "user/repo:Q4_K_M"])
        assert args.hf_repo == "user/repo:Q4_K_M"
        assert getattr(args, "file" if command == ("bench", "pager") else "model") is None


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=" ".join)
def test_every_model_command_resolves_hf(command, offline, cli, tmp_path, monkeypatch):
    """Each command asks the hub's cache for the model before it reads it (here: not cached)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t").write_text(PROMPT)
    code, out, err = cli(*command, "-hf", "someone/absent-GGUF")
    assert (code, out) == (1, "")
    assert err == f"strata: error: someone/absent-GGUF: not in the cache ({offline}) and HF_HUB_OFFLINE is set\n"


def test_bench_hf_is_bench_model():
    assert normalize_argv(["bench", "-hf", "u/r"]) == ["bench", "model", "-hf", "u/r"]
    assert normalize_argv(["bench", "--hf-repo=u/r"]) == ["bench", "model", "--hf-repo=u/r"]
    assert normalize_argv(["bench", "--json"]) == ["bench", "--json"]


# -- strata.hub ---------------------------------------------------------------------------------


def test_fetch_resolves_every_split_part(repos, split_parts):
    got = hub.fetch("test/tiny-split-GGUF:Q8_0")
    assert got.files == tuple(f"Q8_0/{p.name}" for p in split_parts)
    assert [p.name for p in got.paths] == [p.name for p in split_parts] and got.path == got.paths[0]
    for local, made in zip(got.paths, split_parts):
        assert local.is_file() and local.read_bytes() == made.read_bytes()
        assert local.parent.name == "Q8_0" and local.parents[2].name == "snapshots"
    with strata.load(got.path, threads=1) as m:
        assert len(m.model_file.parts) == 3


def test_resolve_without_a_quant_takes_q4_k_m_then_q8_0(repos):
    """llama.cpp's default order; the projector is never the model."""
    assert hub.resolve("test/tiny-GGUF").name == "Tiny-Q8_0.gguf"
    files = ["mmproj-M-F16.gguf", "M-F16.gguf", "M-Q8_0.gguf", "M-Q4_K_M.gguf"]
    assert hub.pick(files, None) == ["M-Q4_K_M.gguf"]
    assert hub.pick(files[:3], None) == ["M-Q8_0.gguf"]
    assert hub.pick(files[:2], None) == ["M-F16.gguf"]


def test_pick_matches_the_tag_as_llama_cpp():
    files = ["README.md", "M-Q4_K_M.gguf", "m-q4_k_s.gguf", "imatrix.gguf",
             "BF16/M-BF16-00002-of-00002.gguf", "BF16/M-BF16-00001-of-00002.gguf"]
    assert hub.pick(files, "q4_k_m") == ["M-Q4_K_M.gguf"]
    assert hub.pick(files, "Q4_K_S") == ["m-q4_k_s.gguf"]
    assert hub.pick(files, "bf16") == ["BF16/M-BF16-00001-of-00002.gguf", "BF16/M-BF16-00002-of-00002.gguf"]
    with pytest.raises(StrataError, match=r"^u/r has no Q4_K file; it has: Q4_K_M, Q4_K_S, BF16$"):
        hub.pick(files, "Q4_K", "u/r")  # a tag is followed by - or .: Q4_K is not Q4_K_M


def test_pick_refuses_a_repository_without_a_model_and_a_split_without_a_part():
    with pytest.raises(StrataError, match=r"^u/r has no GGUF model file$"):
        hub.pick(["README.md", "mmproj-F16.gguf"], None, "u/r")
    with pytest.raises(StrataError, match=r"^u/r: M-Q8_0-00002-of-00003.gguf is missing \(part 2 of 3"):
        hub.pick(["M-Q8_0-00001-of-00003.gguf", "M-Q8_0-00003-of-00003.gguf"], "Q8_0", "u/r")


@pytest.mark.parametrize("spec", ["", "user", "user/", "/repo", "user/repo/extra", "user//repo", "-user/repo",
                                  "user/repo:Q4 K", "us er/repo"])
def test_bad_specs(spec):
    with pytest.raises(StrataArgumentError, match="expected USER/REPO"):
        hub.parse_spec(spec)


def test_good_specs():
    assert hub.parse_spec("unsloth/Qwen3-30B-A3B-GGUF:UD-Q4_K_XL") == ("unsloth/Qwen3-30B-A3B-GGUF", "UD-Q4_K_XL")
    assert hub.parse_spec("user/repo") == ("user/repo", None)
    assert hub.parse_spec("user/repo:") == ("user/repo", None)


def test_a_part_missing_from_the_cache_is_named(repos):
    """A snapshot whose blob is gone (an interrupted download): the part is named, nothing is fetched."""
    snapshot = next((repos / "models--test--tiny-split-GGUF" / "snapshots").iterdir())
    part = next(snapshot.glob("Q8_0/*-00002-of-00003.gguf"))
    part.resolve().unlink()
    with pytest.raises(StrataError, match=r"^test/tiny-split-GGUF: Q8_0/Tiny-Q8_0-00002-of-00003.gguf: not in the cache$"):
        hub.fetch("test/tiny-split-GGUF:Q8_0")


def test_online_lists_the_hub_and_downloads_every_part(offline, monkeypatch, tmp_path):
    """Online, the hub's listing picks the files and each part goes through hf_hub_download (stood in
    for here: no download in tests), which may reach the network."""
    import huggingface_hub

    listing = ["README.md", "Q4_K_M/M-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/M-Q4_K_M-00002-of-00002.gguf",
               "M-Q8_0.gguf"]
    calls = []

    def download(repo_id, filename, *, cache_dir=None, local_files_only=False):
        calls.append((repo_id, filename, local_files_only))
        return str(tmp_path / filename.replace("/", "_"))

    info = SimpleNamespace(siblings=[SimpleNamespace(rfilename=f) for f in listing])
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, repo_id: info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    got = hub.fetch("u/r", offline=False)
    assert calls == [("u/r", listing[1], False), ("u/r", listing[2], False)]
    assert got.files == tuple(listing[1:3]) and got.path == tmp_path / "Q4_K_M_M-Q4_K_M-00001-of-00002.gguf"


def test_an_unreachable_hub_falls_back_to_the_cache(repos, monkeypatch):
    """As llama.cpp: when the listing fails, the cached snapshot answers and nothing is downloaded."""
    import huggingface_hub

    def unreachable(self, repo_id):
        raise OSError("[Errno 101] Network is unreachable")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    assert hub.resolve("test/tiny-GGUF:Q8_0", offline=False).name == "Tiny-Q8_0.gguf"
    with pytest.raises(StrataError, match=r"^someone/else: not in the cache \(.*\) and the hub cannot be reached "
                                          r"\(\[Errno 101\] Network is unreachable\)$"):
        hub.resolve("someone/else", offline=False)
