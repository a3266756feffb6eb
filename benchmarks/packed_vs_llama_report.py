"""The text report of benchmarks/packed_vs_llama.py: its in-RAM and out-of-RAM results (the
JSON it prints with --json) as aligned lines."""
from __future__ import annotations

import json


def human_size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _rate(r: dict | None) -> str:
    if not r:
        return "-"
    return f"{r['mean']:8.2f} +- {r['std']:6.2f} ({r['min']:.2f}-{r['max']:.2f})"


def format_in_ram(r: dict) -> str:
    lines = [f"threads {r['threads']}; prefill {r['prompt']} tokens x {r['reps']}, decode {r['n']} tokens x "
             f"{r['reps']}, {r.get('rounds', 1)} round(s) per engine; strata.load args {json.dumps(r['strata_args'])}",
             f"{'shape':<13} {'engine':<18} {'prefill tok/s: mean +- std (min-max)':<40} decode tok/s"]
    for s in r["shapes"]:
        head = f"{s['shape']:<13}"
        for key, name in (("llama", "llama.cpp"), ("strata", "strata")):
            x = s[key]
            body = (f"FAILED: {x['error']}" if "error" in x else
                    f"{_rate(x.get('prefill_tok_s')):<40} {_rate(x.get('decode_tok_s'))}")
            lines.append(f"{head} {name:<18} {body}")
            head = human_size(s["file_bytes"]).ljust(13)
        if "decode_ratio" in s:
            lines.append(f"{'':<13} {'strata/llama.cpp':<18} {s['prefill_ratio']:8.2f}x{'':<31} "
                         f"{s['decode_ratio']:8.2f}x")
            if len(s.get("decode_ratio_rounds", [])) > 1:  # the median above; each round's own
                rounds = lambda key: " ".join(f"{x:.2f}" for x in s[key])  # noqa: E731
                lines.append(f"{'':<13} {'  per round':<18} {rounds('prefill_ratio_rounds'):<40} "
                             f"{rounds('decode_ratio_rounds')}")
        lines += _isa_lines(s)
    return "\n".join(lines)


def _kernel(t: dict) -> str:
    """'avx512', 'no packed kernel', or 'avx512 (decode avx2)' where decode runs another family."""
    if not t["runs"]:
        return "no packed kernel"
    decode = t.get("decode_runs")
    return t["runs"] if decode in (None, t["runs"]) else f"{t['runs']} (decode {decode})"


def _isa_lines(s: dict) -> list[str]:
    """Which ISA each engine ran on one shape's file."""
    lines = []
    if "isa" in s["llama"]:
        lines.append(f"{'':<13} {'llama.cpp ISA':<18} {s['llama']['isa']}")
    if "isa" in s["strata"]:
        isa = s["strata"]["isa"]
        kernels = ", ".join(f"{name} {100 * t['share']:.0f}% {_kernel(t)}" for name, t in isa["types"].items())
        vnni = " with AVX-VNNI" if isa.get("avx_vnni") and isa["default"] == "avx2" else ""
        lines.append(f"{'':<13} {'strata ISA':<18} {isa['default']}{vnni}; per type (share of bytes, kernel): {kernels}")
    return lines


def format_out_of_ram(r: dict) -> str:
    x = r["strata"]
    lines = [f"{r['file']}: {human_size(r['file_bytes'])}, cold copy ({r['copy_s']:.0f} s), memory cgroup "
             f"{r['limit_bytes'] / 2**30:.2f} GiB = file / {r['file_bytes'] / r['limit_bytes']:.2f}; threads "
             f"{r['threads']}; strata.load args {json.dumps(r['strata_args'])}",
             f"  O_DIRECT sequential read: {r['read_bytes_per_s']['before'] / 1e9:.2f} GB/s before, "
             f"{r['read_bytes_per_s']['after'] / 1e9:.2f} after the decode"]
    if "slab_read_bytes_per_s" in r:
        lines.append(f"  O_DIRECT expert slabs in random order, 16 in flight (the pager's default threads): "
                     f"{r['slab_read_bytes_per_s']['before'] / 1e9:.2f} GB/s before, "
                     f"{r['slab_read_bytes_per_s']['after'] / 1e9:.2f} after")
    if "error" in x:
        return "\n".join(lines + [f"  strata FAILED ({x.get('returncode')}): {x['error']}"])
    run = x["decode"]
    lines.append(f"  strata decode: {run['tok_s']:.2f} tok/s over {run['tokens']} tokens (after warm-up); peak RSS "
                 f"{x['self_peak_rss_kib'] / 1024:.0f} MiB, cgroup peak {x['cgroup_peak_bytes'] / 2**20:.0f} MiB, "
                 f"failcnt {x['cgroup_failcnt']}")
    if "disk_bytes_per_token" in r:
        lines.append(f"  expert bytes read from disk per token: {r['disk_bytes_per_token'] / 2**20:.1f} MiB")
    for bound, what in (("disk_bound", "disk-bound rate"),
                        ("slab_disk_bound", "disk-bound rate at the random-slab read rate")):
        if f"{bound}_tok_s" in r:
            lines.append(f"  {what}: {r[f'{bound}_tok_s']:.2f} tok/s; strata reaches "
                         f"{100 * r[f'share_of_{bound}']:.0f}% of it")
    if "compute_bound_tok_s" in r:
        lines.append(f"  compute-bound rate (the same decode in RAM, experts read in place): "
                     f"{r['compute_bound_tok_s']:.2f} tok/s; strata reaches {100 * r['share_of_bound']:.0f}% of the "
                     f"lower bound ({r['bound_tok_s']:.2f} tok/s)")
    elif "in_ram" in r:
        lines.append(f"  compute-bound run FAILED: {r['in_ram'].get('error')}")
    if "per_token_s" in r:
        t = r["per_token_s"]
        parts = ", ".join(f"{k[:-2]} {1e3 * v:.1f}" for k, v in t.items() if k not in ("total", "other"))
        lines.append(f"  per token (ms): total {1e3 * t['total']:.1f}; {parts}; the rest {1e3 * t['other']:.1f}")
    lines.append(f"  memory: {x['memory']}")
    y = r.get("llama")
    if y is not None and "error" in y:
        lines.append(f"  llama.cpp FAILED ({y.get('returncode')}): {y['error']}")
    elif y is not None:
        d = y["decode"]
        lines.append(f"  llama.cpp decode (same cgroup, fresh cold copy): {d['tok_s']:.3f} tok/s over {d['tokens']} "
                     f"tokens ({d['seconds']:.0f} s); cgroup peak {y['cgroup_peak_bytes'] / 2**20:.0f} MiB, failcnt "
                     f"{y['cgroup_failcnt']}; strata/llama.cpp {run['tok_s'] / d['tok_s']:.1f}x" if d["tokens"] else
                     f"  llama.cpp decode: no token within {d['seconds']:.0f} s")
    return "\n".join(lines)
