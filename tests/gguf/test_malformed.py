"""A corpus of malformed files: each is refused with a StrataFormatError naming file and field.

Every file is opened once in a child interpreter with a timeout, so a hang or a crash on a
hostile header fails a test instead of killing pytest; the files whose corruption gguf-py's
reader alone would survive badly (absurd counts) are only ever opened there.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from strata.errors import StrataFormatError
from strata.gguf import open_model

from . import fixtures as fx
from .fixtures import Dims

ROOT = Path(__file__).resolve().parents[2]
BIG = 2**62
BASE = "qwen3moe"  # the well-formed file most cases corrupt
EXPERT = "blk.0.ffn_gate_exps.weight"


def _copy(files, dst: Path) -> Path:
    return fx.copy(files[BASE][0], dst)


def _tensor_field(field: str, value: int, name: str = EXPERT, fmt: str = "Q"):
    def build(files, dst):
        p = _copy(files, dst)
        return fx.patch(p, fx.tensor_field_offsets(p, name)[field], fmt, value)
    return build


def _kv_value(key: str, value: int, fmt: str = "Q", skip: int = 0):
    """Patch the field `skip` bytes into `key`'s value (array length: skip=4, after the item type)."""
    def build(files, dst):
        p = _copy(files, dst)
        return fx.patch(p, fx.kv_value_offset(p, key) + skip, fmt, value)
    return build


def _header_word(offset: int, fmt: str, value: int):
    def build(files, dst):
        return fx.patch(_copy(files, dst), offset, fmt, value)
    return build


def _truncated(size: Callable[[Path], int]):
    def build(files, dst):
        p = _copy(files, dst)
        return fx.truncate(p, size(p))
    return build


def _written(writer, **kw):
    def build(files, dst):
        writer(dst, **kw)
        return dst
    return build


def _overlap(files, dst):
    p = _copy(files, dst)
    return fx.patch(p, fx.tensor_field_offsets(p, "output_norm.weight")["offset"], "Q", 0)


def _unknown_arch(files, dst):
    mw = fx.ModelWriter(dst, "bert")
    mw.w.add_block_count(1)
    return mw.finish()


def _n_dims_5(files, dst):
    p = _copy(files, dst)
    return fx.patch(p, fx.tensor_field_offsets(p, "output_norm.weight")["ne0"] - 4, "I", 5)


def _alignment_3(files, dst):
    mw = fx.ModelWriter(dst, "qwen3moe")
    mw.w.add_uint32("general.alignment", 3)
    return mw.finish()


def _empty(files, dst):
    dst.write_bytes(b"")
    return dst


# case -> (builder, substrings the message must hold besides the file name, hostile)
CASES: dict[str, tuple[Callable, tuple[str, ...], bool]] = {
    "empty_file": (_empty, ("header", "0-byte"), False),
    "truncated_header": (_truncated(lambda p: 100), ("n_tensors", "truncated"), False),
    "truncated_tensor_info": (_truncated(lambda p: fx.data_offset(p) - 20), ("tensor", "truncated"), False),
    "truncated_data": (_truncated(lambda p: p.stat().st_size - 1000), ("'blk.1.ffn_down_exps.weight'", "truncated"),
                       False),
    "bad_magic": (_header_word(0, "4s", b"GGUX"), ("not a GGUF file", "GGUX"), False),
    "version_1": (_header_word(4, "I", 1), ("version", "found 1"), False),
    "version_4": (_header_word(4, "I", 4), ("version", "found 4"), False),
    "big_endian": (_header_word(4, "I", 3 << 24), ("version", "big-endian"), False),
    "tensor_past_eof": (_tensor_field("offset", 2**40), (f"'{EXPERT}'", "inside the file"), False),
    "misaligned_offset": (_tensor_field("offset", 32 + 1, name="token_embd.weight"),
                          ("'token_embd.weight'", "alignment 32", "found 33"), False),
    "overlapping_tensors": (_overlap, ("'output_norm.weight'", "'token_embd.weight'", "relative byte 0"), False),
    "unknown_ggml_type": (_tensor_field("type", 99, fmt="I"), (f"'{EXPERT}'", "ggml type", "found 99"), False),
    "partial_block_row": (_tensor_field("ne0", 33, name="token_embd.weight"),
                          ("'token_embd.weight'", "Q8_0 block of 32", "found 33"), False),
    "too_many_dims": (_n_dims_5, ("'output_norm.weight'", "n_dims", "found 5"), True),
    "bad_alignment_value": (_alignment_3, ("'general.alignment'", "power of two", "found 3"), False),
    "unknown_value_type": (_kv_value("qwen3moe.block_count", 77, fmt="I", skip=-4),
                           ("'qwen3moe.block_count'", "value type", "found 77"), False),
    "expert_count_contradicts_shape": (_written(fx.write_qwen3moe, meta=Dims(n_experts=3)),
                                       (f"'{EXPERT}'", "shape", "expert_count=3", "found (4, 64, 256)"), False),
    "expert_ff_contradicts_shape": (_written(fx.write_qwen3moe, meta=Dims(n_ff_exp=32)),
                                    (f"'{EXPERT}'", "shape", "n_ff_exp=32"), False),
    "fused_contradicts_shape": (_written(fx.write_qwen3moe_fused, meta=Dims(n_ff_exp=48)),
                                ("'blk.0.ffn_gate_up_exps.weight'", "2*n_ff_exp"), False),
    "missing_block_count": (_written(fx.write_qwen3moe, drop={"qwen3moe.block_count"}),
                            ("'qwen3moe.block_count'", "required"), False),
    "missing_expert_count": (_written(fx.write_olmoe, drop={"olmoe.expert_count"}),
                             ("'olmoe.expert_count'", "required"), False),
    "missing_rms_eps": (_written(fx.write_deepseek2, drop={"deepseek2.attention.layer_norm_rms_epsilon"}),
                        ("'deepseek2.attention.layer_norm_rms_epsilon'",), False),
    "missing_kv_lora_rank": (_written(fx.write_deepseek2, drop={"deepseek2.attention.kv_lora_rank"}),
                             ("'deepseek2.attention.kv_lora_rank'",), False),
    "unsupported_arch": (_unknown_arch, ("'general.architecture'", "'bert'"), False),
    # absurd counts: gguf-py alone would loop ~2**62 times or read garbage
    "n_tensors_2**62": (_header_word(8, "Q", BIG), ("n_tensors", str(BIG)), True),
    "n_kv_2**62": (_header_word(16, "Q", BIG), ("n_kv", str(BIG)), True),
    "key_length_2**62": (_header_word(24, "Q", BIG), ("metadata entry 0", "string length", str(BIG)), True),
    "string_value_2**62": (_kv_value("general.architecture", BIG),
                           ("'general.architecture'", "string length", str(BIG)), True),
    "string_array_2**62": (_kv_value("tokenizer.ggml.tokens", BIG, skip=4),
                           ("'tokenizer.ggml.tokens'", "array length", str(BIG)), True),
    "float_array_2**62": (_kv_value("tokenizer.ggml.scores", BIG, skip=4),
                          ("'tokenizer.ggml.scores'", "array length", str(BIG)), True),
    "string_in_array_2**62": (_kv_value("tokenizer.ggml.tokens", BIG, skip=12),
                              ("'tokenizer.ggml.tokens'[0]", "string length", str(BIG)), True),
    "dims_2**62": (_tensor_field("ne0", BIG, name="output_norm.weight"), ("'output_norm.weight'",), True),
}


_CHILD = """
import json, sys
from strata.errors import StrataFormatError
from strata.gguf import open_model
out = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        open_model(path, cross_check=True).close()
        out[name] = ["opened", ""]
    except StrataFormatError as e:
        out[name] = ["StrataFormatError", str(e)]
    except BaseException as e:
        out[name] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""


def open_in_child(paths: dict[str, str], timeout: float = 60) -> dict[str, list[str]]:
    """Open every file in a fresh interpreter; a hang or a crash fails here, not in pytest."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(paths)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert proc.returncode == 0, f"child interpreter died ({proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def corpus(model_files, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("malformed")
    return {case: build(model_files, root / f"{case}.gguf") for case, (build, _, _) in CASES.items()}


@pytest.fixture(scope="module")
def outcomes(corpus) -> dict[str, list[str]]:
    return open_in_child({case: str(p) for case, p in corpus.items()})


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_file_is_refused(case, corpus, outcomes):
    kind, message = outcomes[case]
    assert kind == "StrataFormatError", f"{case}: {kind}: {message}"
    assert corpus[case].name in message
    for part in CASES[case][1]:
        assert part in message, f"{case}: {part!r} not in {message!r}"


@pytest.mark.parametrize("case", sorted(c for c, (_, _, hostile) in CASES.items() if not hostile))
def test_malformed_file_is_refused_in_process(case, corpus):
    with pytest.raises(StrataFormatError) as err:
        open_model(corpus[case], cross_check=True)
    assert corpus[case].name in str(err.value)


_FUZZ_CHILD = """
import json, random, sys
from pathlib import Path
from strata.errors import StrataFormatError
from strata.gguf import open_model
base, header_end, out_path, n = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
data, rng = Path(base).read_bytes(), random.Random(1234)
counts = {"opened": 0, "StrataFormatError": 0}
for i in range(n):
    buf = bytearray(data)
    at = rng.randrange(header_end)
    if rng.random() < 0.5:
        buf[at] = rng.randrange(256)
    else:  # a large little-endian word, where counts and lengths live
        buf[at:at + 8] = rng.choice([2**62, 2**63 - 1, 2**64 - 1, 2**32, 255]).to_bytes(8, "little")
    out_path.write_bytes(bytes(buf))
    try:
        open_model(out_path, cross_check=True).close()
        counts["opened"] += 1
    except StrataFormatError:
        counts["StrataFormatError"] += 1
    except BaseException as e:
        print(json.dumps({"mutant": i, "offset": at, "error": type(e).__name__ + ": " + str(e)[:300]}))
        sys.exit(3)
print(json.dumps(counts))
"""


N_MUTANTS = 1500


def test_random_header_corruption_never_escapes(model_files, tmp_path):
    """Random byte and word overwrites in the header: open or StrataFormatError, nothing else."""
    base = model_files["mixtral"][0]
    proc = subprocess.run(
        [sys.executable, "-c", _FUZZ_CHILD, str(base), str(fx.data_offset(base)), str(tmp_path / "m.gguf"),
         str(N_MUTANTS)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    counts = json.loads(proc.stdout)
    assert counts["opened"] + counts["StrataFormatError"] == N_MUTANTS and counts["StrataFormatError"] > N_MUTANTS // 2
