"""What users read speaks of the project and its use: --help texts and the README name no internal
issue, folder or article, and the README's figures table stays short and in plain words (the
kernel detail lives in benchmarks/RESULTS.md)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from strata.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
#: words of the project's own workings that mean nothing to a user
INTERNAL = re.compile(r"\bissue \d+|shared/|the seeds|\bsession\b", re.IGNORECASE)
#: instruction-set and kernel jargon kept out of the README's figures
JARGON = re.compile(r"VPDP|VPSHUFB|GFNI|VBMI|AVX-VNNI|\bzmm\b|\bymm\b|planes|gather|tiles?\b|digit sums|L3",
                    re.IGNORECASE)


def _helps(parser, prefix="strata"):
    yield prefix, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _helps(sub, f"{prefix} {name}")


def test_help_texts_speak_to_users():
    found = {cmd: INTERNAL.findall(text) for cmd, text in _helps(build_parser())}
    assert len(found) > 10
    assert {cmd: words for cmd, words in found.items() if words} == {}


def test_the_readme_and_docs_name_no_internal_issue():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert not re.search(r"\bissue \d+", page.read_text()), page


def test_the_readme_figures_are_few_and_plain():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Measured figures"):readme.index("## Documentation")]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # less the head and its rule
    assert 5 <= len(rows) <= 10, rows
    assert [r for r in rows if JARGON.search(r)] == []
    assert "benchmarks/RESULTS.md" in section
