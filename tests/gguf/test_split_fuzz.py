"""Hostile split models: every structured malformation of a part set (a part missing, renamed,
miscounted, of another model, holding a duplicated tensor, with split keys of wrong types or
values, truncated) and seeded random mutants of one part of a valid set end in a clean run or one
`strata: error:` line, never a traceback, signal or timeout, for open_model, `strata inspect` and
`strata generate` opened from any part (tests/fuzz's harness: each case in a child process)."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFValueType

from tests.fixtures.tiny import zoo
from tests.fuzz.harness import run_cases

from .fixtures import data_offset
from .split_fixture import rewrite_part, split_gguf, tensor_cuts

V = GGUFValueType
RUN = ["open", "inspect", "generate"]
N_PARTS = 3


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The tiny qwen3moe file (Q8_0 / Q4_K experts) and a clean three-part split of it."""
    root = tmp_path_factory.mktemp("split-fuzz-base")
    src = root / "base.gguf"
    shutil.copyfile(zoo().get("qwen3moe").gguf(None), src)
    return src, split_gguf(src, root / "m", tensor_cuts(src, N_PARTS))


class _Cases:
    def __init__(self, clean: list[Path], workdir: Path):
        self.clean, self.workdir, self.cases = clean, workdir, []

    def new(self) -> list[Path]:
        """A fresh copy of the clean set in a folder of its own."""
        folder = self.workdir / f"c{len(self.cases):04d}"
        folder.mkdir()
        out = [folder / p.name for p in self.clean]
        for p, q in zip(self.clean, out):
            shutil.copyfile(p, q)
        return out

    def add(self, name: str, opened: Path, memory: str = "tiered") -> None:
        self.cases.append({"name": f"split: {name}", "path": str(opened), "commands": RUN, "memory": memory})


def build_structured(src: Path, clean: list[Path], workdir: Path) -> list[dict]:
    c = _Cases(clean, workdir)
    for i in range(N_PARTS):
        parts = c.new()
        parts[i].unlink()
        c.add(f"part {i + 1} missing", parts[(i + 1) % N_PARTS])
    parts = c.new()
    parts[1].replace(parts[0].with_name("tmp"))
    parts[2].replace(parts[1])
    parts[0].with_name("tmp").replace(parts[2])
    c.add("parts 2 and 3 swapped", parts[0])
    parts = c.new()
    c.add("part 1 renamed", parts[0].replace(parts[0].with_name("model.gguf")))
    for i in range(N_PARTS):
        for key, value, vtype in (("split.count", 2, V.UINT16), ("split.count", 4, V.UINT16),
                                  ("split.count", 0, V.UINT16), ("split.count", 65535, V.UINT16),
                                  ("split.no", 7, V.UINT16), ("split.no", 1, V.UINT32),
                                  ("split.tensors.count", -1, V.INT32), ("split.tensors.count", 2**31 - 1, V.INT32),
                                  ("split.tensors.count", 5, V.UINT64), ("general.architecture", "llama", V.STRING),
                                  ("qwen3moe.block_count", 9, V.UINT32)):
            parts = c.new()
            rewrite_part(parts[i], {key: (value, vtype)})
            c.add(f"part {i + 1} {key}={value} ({vtype.name})", parts[(i + 2) % N_PARTS])
        parts = c.new()
        rewrite_part(parts[i], drop_last=True)
        c.add(f"part {i + 1} without its last tensor", parts[0])
        parts = c.new()
        shutil.copyfile(src, parts[i])
        c.add(f"the whole model as part {i + 1}", parts[(i + 1) % N_PARTS])
        for cut in (0, 30, data_offset(parts[i]) - 1, data_offset(parts[i]) + 100, parts[i].stat().st_size - 1):
            parts = c.new()
            with open(parts[i], "r+b") as f:
                f.truncate(cut)
            c.add(f"part {i + 1} truncated at {cut}", parts[0])
    first_tensor = GGUFReader(src).tensors[0].name
    for name, kw in (("duplicated tensor", {"extra": [first_tensor]}),
                     ("arch in every part", {"arch_in_every_part": True}),
                     ("first part without tensors", {}), ("numbers 0,2,1", {"numbers": [0, 2, 1]})):
        folder = workdir / f"k{len(c.cases):04d}"
        folder.mkdir()
        cuts = [0, *tensor_cuts(src, N_PARTS - 1)] if name == "first part without tensors" else tensor_cuts(src, N_PARTS)
        parts = split_gguf(src, folder / "m", cuts, **kw)
        c.add(name, parts[-1], memory="direct")
    return c.cases


def build_random(clean: list[Path], workdir: Path, n: int, seed: int) -> list[dict]:
    """`n` seeded mutants: one part's header bytes flipped or overwritten, or the part truncated,
    or its tensor data corrupted; opened from a random part."""
    rng = random.Random(seed)
    c = _Cases(clean, workdir)
    for i in range(n):
        parts = c.new()
        victim = parts[rng.randrange(N_PARTS)]
        buf, header_end = bytearray(victim.read_bytes()), data_offset(victim)
        kind = rng.choices(("flip", "word", "truncate", "data"), weights=(45, 25, 15, 15))[0]
        if kind == "flip":
            for _ in range(rng.randint(1, 6)):
                buf[rng.randrange(header_end)] = rng.randrange(256)
        elif kind == "word":
            at, width = rng.randrange(header_end - 8), rng.choice((2, 4, 8))
            buf[at:at + width] = rng.randrange(1 << 8 * width).to_bytes(width, "little")
        elif kind == "truncate":
            del buf[rng.randrange(len(buf)):]
        else:
            for _ in range(rng.randint(1, 64)):
                buf[header_end + rng.randrange(len(buf) - header_end)] = rng.randrange(256)
        victim.write_bytes(bytes(buf))
        c.add(f"random {kind} of {victim.name} #{i} (seed {seed})", parts[rng.randrange(N_PARTS)],
              memory="direct" if i % 3 == 0 else "tiered")
    return c.cases


def test_fuzz_split_parts(base, tmp_path):
    src, clean = base
    (tmp_path / "s").mkdir()
    (tmp_path / "r").mkdir()
    cases = build_structured(src, clean, tmp_path / "s") + build_random(clean, tmp_path / "r", 80, seed=20261201)
    cases.append({"name": "split: clean", "path": str(clean[1]), "commands": RUN, "memory": "tiered"})
    report = run_cases(cases, tmp_path)
    print(report.summary())
    assert report.failures == [], "\n".join(report.failures[:20])
    assert report.n_cases >= 140
    # the clean set and the harmless variants run; the malformed ones are refused at open
    assert report.verdicts[("generate", "ok")] >= 5 and report.verdicts[("inspect", "ok")] >= 5
    assert report.verdicts[("open", "error")] >= 60
