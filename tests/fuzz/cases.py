"""Fuzz cases: structured malformations of a valid tiny GGUF, and seeded random mutants of it.

A case is {"name", "path", "commands"} (see `tests.fuzz.runner`). Structured cases cover every
header field, the tensor table, truncations, the hyperparameters, the tokenizer and the chat
template; random mutants flip bytes and words of the header, truncate the file, rewrite
characters of the chat template or corrupt tensor data.
"""
from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

from gguf import GGUFReader

from tests.fixtures.rewrite import V, patch_string, rewrite, string_value_span
from tests.gguf.fixtures import data_offset, patch, tensor_field_offsets, truncate

ARCH = "qwen3moe"
RUN = ["open", "inspect", "generate"]
CHAT = ["open", "generate", "chat"]
INTERESTING = [0, 1, 2, 3, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**40, 2**63 - 1, 2**64 - 1]
TEMPLATE_CHARS = "{}%#()[]|.,'\"-+*~/ _xyzmsnil0123456789\n"


def _k(suffix: str) -> str:
    return f"{ARCH}.{suffix}"


def hparam_changes() -> list[tuple[str, dict]]:
    """(name, {key: (value, type)}) for the hyperparameter cases."""
    f, i, u = V.FLOAT32, V.INT32, V.UINT32
    out = []
    for key, values in [("rope.freq_base", [math.nan, math.inf, 0.0, -1.0]),
                        ("attention.layer_norm_rms_epsilon", [math.nan, math.inf, 0.0, -1e-5]),
                        ("expert_weights_scale", [math.nan, math.inf, 0.0, -1.0]),
                        ("rope.scaling.yarn_ext_factor", [math.nan])]:
        out += [(f"{key}={v}", {_k(key): (v, f)}) for v in values]
    yarn = {_k("rope.scaling.type"): ("yarn", V.STRING)}
    out += [(f"yarn factor={v}", {**yarn, _k("rope.scaling.factor"): (v, f)}) for v in (-1.0, math.nan, math.inf)]
    out += [(f"yarn orig ctx={v}", {**yarn, _k("rope.scaling.original_context_length"): (v, i)}) for v in (0, -5)]
    for key, values, t in [("rope.dimension_count", [63, -2, 128, 0], i), ("context_length", [0, 1, 2**31], u),
                           ("block_count", [0, 3, 2**31], u), ("embedding_length", [0, 128, 2**31], u),
                           ("attention.head_count", [0, 3, 2**31], u), ("attention.head_count_kv", [0, 3, 5], u),
                           ("attention.key_length", [0, 63, 2**20], u), ("expert_count", [0, 3, 5, 2**31], u),
                           ("expert_used_count", [0, 5, -1], i), ("vocab_size", [599, 601], u),
                           ("expert_feed_forward_length", [0, 255], u), ("feed_forward_length", [0], u)]:
        out += [(f"{key}={v}", {_k(key): (v, t)}) for v in values]
    out += [("context_length string", {_k("context_length"): ("512", V.STRING)}),
            ("freq_base string", {_k("rope.freq_base"): ("1e4", V.STRING)}),
            ("block_count float", {_k("block_count"): (2.0, f)}),
            ("expert_count array", {_k("expert_count"): ([4, 4], V.ARRAY, u)})]
    # the scaling and routing keys real files carry (tests/gguf/test_hparams_metadata_keys.py)
    out += [(f"rope type {v}", {_k("rope.scaling.type"): (v, V.STRING)}) for v in ("ntk", "", "YARN")]
    out += [(f"rope attn_factor={v}", {_k("rope.scaling.attn_factor"): (v, f)}) for v in (0.0, -1.0, math.nan)]
    out += [(f"yarn attn_factor={v}", {**yarn, _k("rope.scaling.yarn_attn_factor"): (v, f)}) for v in (0.0, math.inf)]
    out += [(f"gating func={v}", {_k("expert_gating_func"): (v, u)}) for v in (4, 7, 2**31)]
    out += [(f"expert groups={g}/{gu}", {_k("expert_group_count"): (g, u), _k("expert_group_used_count"): (gu, u)})
            for g, gu in ((3, 1), (4, 1), (2, 2), (2, 0))]
    return out


def tokenizer_changes(tokens: list[str], merges: list[str]) -> list[tuple[str, dict, set]]:
    """(name, set, drop) for the tokenizer and template-type cases."""
    T, S, A, i = "tokenizer.ggml.", V.STRING, V.ARRAY, V.INT32
    n = len(tokens)
    return [
        ("tokens shorter", {T + "tokens": (tokens[:-1], A, S)}, set()),
        ("tokens longer", {T + "tokens": (tokens + ["extra"], A, S)}, set()),
        ("tokens string", {T + "tokens": ("abc", S)}, set()),
        ("tokens ints", {T + "tokens": (list(range(n)), A, i)}, set()),
        ("tokens one", {T + "tokens": (["a"], A, S)}, set()),
        ("no tokens", {}, {T + "tokens"}),
        ("types short", {T + "token_type": ([1] * (n - 1), A, i)}, set()),
        ("types bad", {T + "token_type": ([99] * n, A, i)}, set()),
        ("types strings", {T + "token_type": (["1"] * n, A, S)}, set()),
        ("scores short", {T + "scores": ([0.0] * 3, A, V.FLOAT32)}, set()),
        ("scores nan", {T + "scores": ([math.nan] * n, A, V.FLOAT32)}, set()),
        ("merge missing token", {T + "merges": (["zzq qqz"] + merges, A, S)}, set()),
        ("merge no space", {T + "merges": (["hello"] + merges, A, S)}, set()),
        ("merges ints", {T + "merges": ([1, 2, 3], A, i)}, set()),
        ("no merges", {}, {T + "merges"}),
        ("eos out of range", {T + "eos_token_id": (n, V.UINT32)}, set()),
        ("eos negative", {T + "eos_token_id": (-1, i)}, set()),
        ("eos string", {T + "eos_token_id": ("2", S)}, set()),
        ("bos huge", {T + "bos_token_id": (2**31, V.UINT32), T + "add_bos_token": (True, V.BOOL)}, set()),
        ("pad huge", {T + "padding_token_id": (10**9, V.UINT32)}, set()),
        ("add_bos int", {T + "add_bos_token": (1, i)}, set()),
        ("model bert", {T + "model": ("bert", S)}, set()),
        ("model int", {T + "model": (3, i)}, set()),
        ("pre unknown", {T + "pre": ("nonesuch", S)}, set()),
        ("pre empty", {T + "pre": ("", S)}, set()),
        ("pre kimi", {T + "pre": ("kimi-k2", S)}, set()),
        ("model rwkv", {T + "model": ("rwkv", S)}, set()),
        ("model t5", {T + "model": ("t5", S)}, set()),
        ("model gemma4", {T + "model": ("gemma4", S)}, set()),
        ("types long", {T + "token_type": ([1] * (n + 1), A, i)}, set()),
        ("scores long", {T + "scores": ([0.0] * (n + 1), A, V.FLOAT32)}, set()),
        ("merge join unknown", {T + "merges": ([f"{tokens[-1]} {tokens[-1]}"] + merges, A, S)}, set()),
        ("merge empty right", {T + "merges": ([f"{tokens[-1]} "] + merges, A, S)}, set()),
        ("eot out of range", {T + "eot_token_id": (n, V.UINT32)}, set()),
        ("eom negative", {T + "eom_token_id": (-3, i)}, set()),
        ("pre int", {T + "pre": (5, i)}, set()),
        ("template int", {"tokenizer.chat_template": (5, i)}, set()),
        ("template array", {"tokenizer.chat_template": (["{{ x }}"], A, S)}, set()),
    ]


TEMPLATES = {
    "deep if": "{% if true %}" * 3000 + "x" + "{% endif %}" * 3000,
    "deep parens": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "include": "{% include 'other.jinja' %}",
    "import": "{% import 'macros.jinja' as m %}{{ m.x() }}",
    "extends": "{% extends 'base.jinja' %}",
    "raise": "{{ raise_exception('refused') }}",
    "zero division": "{{ 1 / 0 }}",
    "type error": "{{ 'a' + 1 }}",
    "index error": "{{ messages[99]['content'] }}",
    "huge repeat": "{{ 'x' * 1000000000 }}",
    "huge tojson indent": "{{ messages | tojson(indent=1000000000) }}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "percent width": "{{ '%999999999s' % 1 }}",
    "center": "{{ 'x' | center(1000000000) }}",
    "namespace doubling": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                          "{% endfor %}{{ ns.s | length }}",
    "list doubling": "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}"
                     "{% endfor %}{{ ns.l | length }}",
    "big range": "{{ range(1000000000) | list | length }}",
    "big power": "{{ 9 ** 99999999 }}",
    "syntax": "{% for m in messages %}{{ m.content }",
    "attribute escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals escape": "{{ cycler.__init__.__globals__.os.system('true') }}",
    "empty": "",
    "output flood": "{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}",
    "join flood": "{{ range(100000) | join('x' * 10000) }}",
}


def build_structured(base: Path, workdir: Path) -> list[dict]:
    """Every structured case, each file written under `workdir`."""
    cases: list[dict] = []

    def new(name: str) -> Path:
        path = workdir / f"s{len(cases):03d}.gguf"
        shutil.copyfile(base, path)
        return path

    def add(name: str, path: Path, commands: list[str] = RUN, memory: str = "tiered") -> None:
        cases.append({"name": name, "path": str(path), "commands": commands, "memory": memory})

    reader = GGUFReader(base)
    n_tensors, n_kv = len(reader.tensors), len(reader.fields) - 3
    add("magic", patch(new("magic"), 0, "4s", b"GGUX"))
    for v in (0, 1, 2, 4, 0xFFFFFFFF):
        add(f"version {v}", patch(new(""), 4, "I", v))
    for v in (0, n_tensors - 1, n_tensors + 1, 2**63, 2**64 - 1):
        add(f"tensor count {v}", patch(new(""), 8, "Q", v))
    for v in (0, n_kv - 1, n_kv + 1, 2**40):
        add(f"kv count {v}", patch(new(""), 16, "Q", v))
    for v in (0, 2**40):
        add(f"first key length {v}", patch(new(""), 24, "Q", v))
    for key in (_k("context_length"), "tokenizer.ggml.tokens", "tokenizer.chat_template"):
        type_at = reader.fields[key].offset + 8 + len(key.encode())
        for v in (99, 8, 9, 12):
            add(f"{key} value type {v}", patch(new(""), type_at, "I", v))
    for name in ("token_embd.weight", "blk.0.ffn_gate_exps.weight", "output_norm.weight"):
        at = tensor_field_offsets(base, name)
        t = next(t for t in reader.tensors if t.name == name)
        for v in (0, 1, 2**40, 2**63):
            add(f"{name} ne0 {v}", patch(new(""), at["ne0"], "Q", v))
        for v in (99, 0, 8, 12):
            add(f"{name} type {v}", patch(new(""), at["type"], "I", v))
        if name == "blk.0.ffn_gate_exps.weight":  # the types of downloaded files, and ones Strata cannot read
            for v in (9, 15, 16, 17, 18, 19, 20, 21, 22, 23, 28, 29, 34, 35, 39, 40):
                add(f"{name} type {v}", patch(new(""), at["type"], "I", v))
        for v in (1, 2**50, 0):
            add(f"{name} offset {v}", patch(new(""), at["offset"], "Q", v))
        for v in (0, 5, 255):
            add(f"{name} n_dims {v}", patch(new(""), at["ne0"] - 4, "I", v))
        add(f"{name} name length", patch(new(""), t.field.offset, "Q", 2**40))
    for v in (0, 3, 2**31):
        add(f"alignment {v}", rewrite(base, new(""), {"general.alignment": (v, V.UINT32)}))
    size, start = base.stat().st_size, data_offset(base)
    for at in (0, 3, 10, 24, 100, start // 2, start - 1, start, start + 1000, size // 2, size - 1):
        add(f"truncate {at}", truncate(new(""), at))
    for name, changes in hparam_changes():
        add(name, rewrite(base, new(""), changes))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    for name, changes, drop in tokenizer_changes(tokens, merges):
        add(name, rewrite(base, new(""), changes, drop), CHAT if "template" in name else RUN)
    add("arch renamed", patch_string(new(""), ARCH.encode(), b"qwen3mox"))
    word = next(t for t in tokens[100:] if t.isascii() and len(t) >= 3)
    add("token invalid utf-8", patch_string(new(""), word.encode(), b"\xff" + word.encode()[1:]), CHAT)
    merge = next(m for m in merges if m.isascii() and len(m) >= 3)
    add("merge invalid utf-8", patch_string(new(""), merge.encode(), b"\xc3" + merge.encode()[1:]), CHAT)
    add("template invalid utf-8", _patch_template(new(""), 0, b"\xfe"), CHAT)
    for name, source in TEMPLATES.items():
        add(f"template {name}", rewrite(base, new(""), {"tokenizer.chat_template": (source, V.STRING)}), CHAT)
    add("direct memory", new(""), ["open", "generate"], memory="direct")
    return cases


def _patch_template(path: Path, at: int, new: bytes) -> Path:
    start, n = string_value_span(path, "tokenizer.chat_template")
    data = bytearray(path.read_bytes())
    data[start + at:start + at + len(new)] = new
    path.write_bytes(bytes(data))
    return path


def build_random(base: Path, workdir: Path, n: int, seed: int) -> list[dict]:
    """`n` seeded random mutants of `base`: header byte flips and word overwrites, truncations,
    chat-template character rewrites and tensor-data corruption."""
    rng, data = random.Random(seed), base.read_bytes()
    header_end = data_offset(base)
    t_start, t_len = string_value_span(base, "tokenizer.chat_template")
    cases = []
    for i in range(n):
        kind = rng.choices(("flip", "word", "truncate", "template", "data"), weights=(40, 20, 10, 20, 10))[0]
        buf, commands = bytearray(data), RUN
        if kind == "flip":
            for _ in range(rng.randint(1, 8)):
                buf[rng.randrange(header_end)] = rng.randrange(256)
        elif kind == "word":
            at, width = rng.randrange(header_end - 8), rng.choice((4, 8))
            buf[at:at + width] = (rng.choice(INTERESTING) % (1 << 8 * width)).to_bytes(width, "little")
        elif kind == "truncate":
            end = rng.randrange(header_end) if rng.random() < 0.6 else rng.randrange(len(buf))
            del buf[end:]
        elif kind == "template":
            for _ in range(rng.randint(1, 4)):
                buf[t_start + rng.randrange(t_len)] = ord(rng.choice(TEMPLATE_CHARS))
            commands = ["open", "chat"]
        else:
            for _ in range(rng.randint(1, 64)):
                buf[header_end + rng.randrange(len(buf) - header_end)] = rng.randrange(256)
            commands = ["open", "generate", "chat"]
        path = workdir / f"r{i:05d}.gguf"
        path.write_bytes(bytes(buf))
        cases.append({"name": f"random {kind} #{i} (seed {seed})", "path": str(path), "commands": commands,
                      "memory": "direct" if i % 3 == 0 else "tiered"})
    return cases


__all__ = ["build_random", "build_structured"]
