"""`strata demo`: the whole path on a fresh machine, in seconds, with nothing downloaded.

1. builds a tiny random Qwen3-MoE checkpoint in Hugging Face's layout (config.json,
   model.safetensors) with a byte-level BPE tokenizer trained on the spot (tokenizer.json,
   tokenizer_config.json with a ChatML template);
2. converts it with `strata.convert` (attention Q8_0, experts Q4_K);
3. loads the GGUF file and generates a short continuation;
4. runs one scripted chat turn through the chat template.

Only the installed package is needed (no transformers): the checkpoint is written directly.
The weights are random, so the text is gibberish; the point is that every step runs.
"""
from __future__ import annotations

import json
import random
import struct
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from strata.tokenizer import QWEN2_REGEX, bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONFIG = {  # small, but every expert row a whole Q4_K block (256 values)
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
    "intermediate_size": 512, "moe_intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
_WORDS = ("the a of to in is it and that expert router token layer memory model cache disk host device "
          "slot page prefetch hot cold warm quantize block scale fast slow read write moves waits runs").split()


def _corpus(n_lines: int, rng: random.Random) -> list[str]:
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 12))) + rng.choice([".", ",", "!", "?"])
            for _ in range(n_lines)]


def build_tokenizer(folder: Path, vocab_size: int = 512, seed: int = 0) -> int:
    """Train a byte-level BPE tokenizer (Qwen2 split rule) and save it into `folder`; its size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(2000, random.Random(seed)), trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "add_bos_token": False, "chat_template": CHAT_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return tok.get_vocab_size()


def _weights(cfg: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    D, V, hd, E, I = (cfg[k] for k in ("hidden_size", "vocab_size", "head_dim", "num_experts", "moe_intermediate_size"))
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def normal(*shape: int, std: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w = {"model.embed_tokens.weight": normal(V, D, std=1.0), "model.norm.weight": np.ones(D, np.float32),
         "lm_head.weight": normal(V, D, std=0.3)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": np.ones(D, np.float32),
              p + "post_attention_layernorm.weight": np.ones(D, np.float32),
              p + "self_attn.q_proj.weight": normal(q, D), p + "self_attn.k_proj.weight": normal(kv, D),
              p + "self_attn.v_proj.weight": normal(kv, D), p + "self_attn.o_proj.weight": normal(D, q),
              p + "self_attn.q_norm.weight": np.ones(hd, np.float32),
              p + "self_attn.k_norm.weight": np.ones(hd, np.float32), p + "mlp.gate.weight": normal(E, D)}
        for e in range(E):
            x = f"{p}mlp.experts.{e}."
            w |= {x + "gate_proj.weight": normal(I, D), x + "up_proj.weight": normal(I, D),
                  x + "down_proj.weight": normal(D, I)}
    return w


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """float32 tensors in the safetensors layout: u64 header size, JSON header, then the bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for t in tensors.values():
            f.write(np.ascontiguousarray(t).tobytes())


def _readable_rows(folder: Path, n_vocab: int) -> np.ndarray:
    """[V] bool: tokens whose bytes are all printable ASCII (not specials, not lone high bytes)."""
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    keep = np.zeros(n_vocab, dtype=bool)
    for piece, i in vocab.items():
        keep[i] = i >= len(SPECIALS) and all(32 <= byte_of.get(c, 0) < 127 for c in piece)
    return keep


def build_checkpoint(folder: Path, seed: int = 0, readable: bool = False, **config: int) -> Path:
    """A tiny random Qwen3-MoE checkpoint with its tokenizer in `folder`; `config` overrides
    entries of CONFIG (e.g. num_hidden_layers, num_experts). `readable` zeroes the output rows of
    tokens that would print as broken bytes, so random weights at least emit word pieces."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(CONFIG, **config, vocab_size=build_tokenizer(folder, seed=seed))
    cfg["eos_token_id"] = SPECIALS.index("<|im_end|>")
    (folder / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    weights = _weights(cfg, np.random.default_rng(seed))
    if readable:
        weights["lm_head.weight"][~_readable_rows(folder, cfg["vocab_size"])] = 0.0
    write_safetensors(folder / "model.safetensors", weights)
    return folder


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 2**20:.1f} MiB"


def run(workdir: str | None = None, device: str = "cpu", threads: int | None = None,
        say: Callable[[str], None] = print) -> dict:
    """Run the four steps, reporting each with `say`; returns what each step produced."""
    from converters import TypePolicy, convert

    import strata

    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="strata-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    hf_dir = build_checkpoint(root / "checkpoint", readable=True)
    files = ", ".join(sorted(p.name for p in hf_dir.iterdir()))
    say(f"[1/4] tiny random MoE checkpoint -> {hf_dir} ({files})")
    gguf_path = root / "demo-q8_0-q4_k.gguf"
    convert(hf_dir, gguf_path, TypePolicy(), name="strata-demo", n_threads=threads)
    say(f"[2/4] converted with strata.convert -> {gguf_path} ({_size(gguf_path)}; attention Q8_0, experts Q4_K)")
    model = strata.load(gguf_path, device=device, threads=threads, n_ctx=512)
    prompt = "the expert router"
    done = model.generate(prompt, max_tokens=24, temperature=0.0)
    say(f"[3/4] generate: {prompt!r} -> {done.text!r} ({len(done.token_ids)} tokens, "
        f"{done.tokens_per_second:.1f} tok/s, {model.device})")
    messages = [{"role": "system", "content": "You are a demo."}, {"role": "user", "content": "Where do experts live?"}]
    reply = model.chat(messages, max_tokens=24, temperature=0.8, seed=1)
    say(f"[4/4] chat: user {messages[1]['content']!r} -> assistant {reply.text!r} "
        f"({len(reply.token_ids)} tokens, {reply.finish_reason})")
    say(f"done: files are in {root} (random weights, so the words are random too). "
        f"Next: strata chat {gguf_path}")
    model.close()
    return {"root": root, "checkpoint": hf_dir, "gguf": gguf_path, "generate": done, "chat": reply}


__all__ = ["CONFIG", "build_checkpoint", "build_tokenizer", "run", "write_safetensors"]
