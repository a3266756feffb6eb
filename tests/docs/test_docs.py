"""The README and docs/ as a newcomer reads them: every example runs, every command has a page.

Convention (stated in docs/README.md): fenced blocks in `sh`, `bash` or `python` run, in page
order, in a scratch folder that holds the demo's files in `demo/` (what `strata demo --dir demo`
writes), with `strata` and `python` on PATH running this checkout. A block preceded by a line
`<!-- not run: REASON -->` is skipped (it needs a download, a GPU, a server or a long run); blocks
in any other language (`text`, `json`, ...) are output or synopses and never run.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUN_LANGUAGES = ("sh", "bash", "python")
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
FENCE = re.compile(r"^```(\S*)\s*$")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0")
BLOCK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    skip_reason: str | None

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES and self.skip_reason is None

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def parse_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the `not run` reason written before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{path.name}:{i + 1}: fence never closed"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        reason = NOT_RUN.search(before)
        blocks.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                            reason.group(1) if reason else None))
        i = end + 1
    return blocks


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory) -> Path:
    """One demo model for the whole module: `strata demo --dir demo`, as the README's tour runs it."""
    root = tmp_path_factory.mktemp("demo-build")
    out = subprocess.run([sys.executable, "-m", "strata", "demo", "--dir", "demo"], cwd=root,
                         env=_env(_shims(root)), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    return root / "demo"


def _shims(root: Path) -> Path:
    """A bin folder whose `strata` and `python` run this checkout with this interpreter."""
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, command in (("strata", f'exec "{sys.executable}" -m strata "$@"'),
                          ("python", f'exec "{sys.executable}" "$@"')):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\n{command}\n")
        shim.chmod(0o755)
    return bin_dir


def _env(bin_dir: Path) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                PYTHONPATH=path, PYTHONIOENCODING="utf-8")


def _run_block(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.language == "python":
        script = cwd / f"block_{block.line}.py"
        script.write_text(block.text, encoding="utf-8")
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.text]
    out = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=BLOCK_TIMEOUT_S)
    assert out.returncode == 0, (f"{block.where()} failed (exit {out.returncode}):\n{block.text}\n"
                                 f"--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}")


RUNNABLE_FILES = [p for p in doc_files() if any(b.runs for b in parse_blocks(p))]


@pytest.mark.parametrize("path", RUNNABLE_FILES, ids=lambda p: p.name if p.parent == ROOT else f"docs/{p.name}")
def test_examples_run_on_the_demo_model(path: Path, demo_files: Path, tmp_path: Path) -> None:
    shutil.copytree(demo_files, tmp_path / "demo")
    env = _env(_shims(tmp_path))
    for block in parse_blocks(path):
        if block.runs and not ("curl " in block.text and shutil.which("curl") is None):
            _run_block(block, tmp_path, env)


def test_every_block_says_what_it_is() -> None:
    """A bare fence would silently escape the convention: each block names its language."""
    bare = [b.where() for p in doc_files() for b in parse_blocks(p) if not b.language]
    assert not bare, f"fenced blocks without a language: {bare}"


def test_readme_api_example_runs_as_written() -> None:
    """The README's Python example is a runnable block that loads the demo model (run above)."""
    api = [b for b in parse_blocks(ROOT / "README.md") if b.language == "python" and b.runs]
    assert any('strata.load("demo/demo-q8_0-q4_k.gguf"' in b.text and "tokenize(" in b.text for b in api)


def test_every_command_has_a_page_with_a_runnable_example() -> None:
    from strata.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    commands = set(sub.choices) | {"convert"}  # `python -m strata.convert` has its page too
    for name in sorted(commands):
        page = DOCS / f"{name}.md"
        assert page.is_file(), f"`strata {name}` has no page docs/{name}.md"
        spelled = (f"strata {name}", "strata.convert") if name == "convert" else (f"strata {name}",)
        assert any(b.runs and any(s in b.text for s in spelled) for b in parse_blocks(page)), \
            f"docs/{name}.md has no runnable example of `strata {name}`"
    bench_page = (DOCS / "bench.md").read_text(encoding="utf-8")
    for sub_name in ("model", "ladder", "tiered", "dequant", "cache", "pager"):
        assert f"strata bench {sub_name}" in bench_page, f"docs/bench.md does not describe `strata bench {sub_name}`"


def test_no_links_outside_the_repository() -> None:
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        for host in re.findall(r"https?://([^/\s)\"'>:`]+)", text):
            assert host in LOCAL_HOSTS, f"{path.relative_to(ROOT)} links outside the repository: {host}"
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "#")):
                continue
            assert (path.parent / target.split("#")[0]).exists(), \
                f"{path.relative_to(ROOT)} links to {target}, which is not in the repository"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = next(line.strip() for line in readme.splitlines()
                   if line.startswith("python -m venv") and '".[test]"' in line)
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_convert_page_lists_every_accepted_checkpoint_class() -> None:
    """docs/convert.md names every `architectures` value the registry converts."""
    from strata import arch
    page = (ROOT / "docs" / "convert.md").read_text(encoding="utf-8")
    missing = [hf for hf in arch.hf_names() if f"`{hf}`" not in page]
    assert not missing, f"docs/convert.md does not list {missing}"
