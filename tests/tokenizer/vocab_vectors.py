"""llama.cpp's tokenizer test vocabularies (`models/ggml-vocab-*.gguf`) and their vectors.

Each `NAME.gguf.inp` holds inputs separated by a line `__ggml_vocab_test__`; `NAME.gguf.out` one
line of ids per input. Read as llama.cpp's tests/test-tokenizer-0.cpp reads them: the separator
includes the newlines around it, so every input keeps its own inner and leading newlines, and the
last input runs to the end of the file unless the file ends with a separator. The ids are those
of `tokenize(text, add_special=false, parse_special=false)`: no BOS/EOS, and the text of CONTROL
tokens is spelled out rather than matched (USER_DEFINED tokens are still matched whole).
"""
from __future__ import annotations

from pathlib import Path

SEPARATOR = "\n__ggml_vocab_test__\n"


def vocab_dir() -> Path | None:
    """`models/` of llama.cpp's source tree (tests/fixtures/tiny.llama_cpp_source: $STRATA_LLAMA_CPP_SRC,
    else the one the suite fetches); None when there is none."""
    from tests.fixtures.tiny import llama_cpp_source

    src = llama_cpp_source()
    return Path(src) / "models" if src else None


def vocab_files(models: Path) -> list[Path]:
    """Every test vocabulary that has vectors beside it."""
    return sorted(p for p in models.glob("ggml-vocab-*.gguf") if Path(f"{p}.inp").is_file())


def vectors(vocab: Path) -> list[tuple[str, list[int]]]:
    """(input text, expected ids) pairs of one vocabulary, in file order."""
    raw = Path(f"{vocab}.inp").read_bytes().decode("utf-8")
    lines = Path(f"{vocab}.out").read_bytes().decode("utf-8").split("\n")
    inputs, pos = [], 0
    while pos < len(raw):
        end = raw.find(SEPARATOR, pos)
        if end < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:end])
        pos = end + len(SEPARATOR)
    if len(lines) < len(inputs):
        raise ValueError(f"{vocab}.out: expected {len(inputs)} lines of ids, found {len(lines)}")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(inputs, lines)]
