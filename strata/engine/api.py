"""Strata's public Python API: `strata.load(path)` -> `Model`.

    import strata
    m = strata.load("model.gguf", device="cpu", dtype="float32", threads=4)
    m.generate("Once upon a time", max_tokens=32).text  # keyword sugar for:
    m.generate("Once upon a time", sampling=SamplingParams(max_tokens=32)).text
    m = strata.load("model.gguf", memory=MemoryConfig("tiered", device_mem="2G", prefetch_depth=1))
    for chunk in m.chat([{"role": "user", "content": "Hi"}], stream=True):
        print(chunk.text, end="")

Must not: touch weights, files or kernels directly (models, memory and native do).
"""
from __future__ import annotations

import functools
import itertools
import operator
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence as Seq

import torch

from strata import native
from strata.defaults import DEFAULT_CTX, DEFAULT_KV_TYPE, KV_TYPES  # DEFAULT_CTX: KV-cache positions per sequence
from strata.errors import StrataArgumentError, StrataError
from strata.gguf import HParams, ModelFile, open_model
from strata.memory import ExpertMemory
from strata.memory.machine import Machine
from strata.models import architecture
from strata.runtime import Runner, RuntimePlan
from strata.runtime import build as build_runner
from strata.tokenizer import Tokenizer

from .build import (MemoryFactory, expert_memory, kv_bytes, kv_cache, memory_config_for, prefix_cache_blocks,
                    settle_default)
from .config import MemoryConfig, check_engine, check_int
from .engine import Engine
from .kv_cache import KVCache, blocks_for
from .scheduler import MAX_STEP_TOKENS
from .perplexity import ChunkDone, PerplexityResult, perplexity
from .grammar import Vocabulary, is_built, vocabulary
from .sampling import FIELDS, SamplingParams
from .sequence import Sequence, stop_conditions
from .stream import Chunk, Completion, Outboxes, Stream
from .verdict import check_runs
from .resolve import resolve_compute, resolve_device, resolve_dtype

if TYPE_CHECKING:  # imported where used: jinja2 costs a one-shot generate tens of ms
    from strata.chat_template import ChatTemplate

DEFAULT_SLOTS = 4  # sequences decoded together at most


class Model:
    """A loaded GGUF model: tokenizer, chat template, and generation on one device.

    Build with `strata.load`. Not thread-safe: one call at a time.
    """

    def __init__(self, model_file: ModelFile, runner: Runner, memory: ExpertMemory, cache: KVCache,
                 tokenizer: Tokenizer, device: torch.device, dtype: torch.dtype, n_threads: int,
                 max_step_tokens: int = MAX_STEP_TOKENS, max_waiting: int | None = None,
                 sampling: SamplingParams | None = None, chat_template: str | None = None, agree=None,
                 decoding_step_tokens: int | None = None):
        self.sampling = sampling or SamplingParams()  # generate's default
        self._template_override = chat_template  # replaces the file's tokenizer.chat_template
        self.model_file, self.runner, self.memory, self.cache = model_file, runner, memory, cache
        self.transformer = runner.model  # the maths (every step through it runs the per-call path)
        self.tokenizer, self.device, self.dtype, self.n_threads = tokenizer, device, dtype, n_threads
        self.engine = Engine(runner, cache, device, max_step_tokens=max_step_tokens, max_waiting=max_waiting,
                             agree=agree, decoding_step_tokens=decoding_step_tokens, check=model_file.check_intact)
        self._ids = itertools.count()
        self._outboxes = Outboxes()  # chunks of open streams, produced by any caller's step
        self._first: dict[int, float] = {}  # sequence id -> time of its first generated token
        self._chat_template: ChatTemplate | None = None  # compiled on first use: a broken one fails chat only
        self._split_base = (0.0, 0.0)  # the memory's waits and dequantization at the last reset_time_split

    # -- facts ---------------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The GGUF file holding the metadata (the first part of a split model)."""
        return self.model_file.path

    @property
    def plan(self) -> RuntimePlan:
        """What runs each kind of step and why (`strata.runtime.plan`), decided at load."""
        return self.runner.plan

    @property
    def hparams(self) -> HParams:
        """The hyperparameters read from the file's metadata."""
        return self.model_file.hparams

    @property
    def n_ctx(self) -> int:
        """The most positions one sequence may hold (prompt and generated tokens)."""
        return self.cache.n_ctx

    def _special_texts(self) -> dict[str, str | None]:
        s, tokens = self.tokenizer.special, self.tokenizer.tokens
        name = {"bos_token": s.bos, "eos_token": s.eos, "unk_token": s.unk, "pad_token": s.pad}
        return {k: tokens[i] if i is not None and 0 <= i < len(tokens) else None for k, i in name.items()}

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """End-of-generation tokens, as llama.cpp decides them: EOS, EOT, EOM and the tokens it
        reads as such by their text (`Tokenizer.eog_ids`)."""
        return self.tokenizer.eog_ids

    # -- text ----------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text` (BOS/EOS added as the file asks when `add_special`)."""
        if not isinstance(text, str):
            raise StrataArgumentError(f"tokenize: expected text (str), found {text!r:.80}")
        return self.check_token_ids(self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special))

    def detokenize(self, token_ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `token_ids` (ids outside the vocabulary are refused, as `generate` refuses them)."""
        return self.tokenizer.decode(self.check_token_ids(token_ids, "detokenize"), skip_special=skip_special)

    def check_token_ids(self, token_ids: Iterable[int], what: str = "token_ids",
                        expected: str = "a sequence of token ids") -> list[int]:
        """`token_ids` as a list of ints, each in [0, vocab_size); one StrataError line otherwise.
        The one check of `tokenize`, `detokenize`, `logits` and `generate`."""
        try:
            if isinstance(token_ids, (str, bytes)):
                raise TypeError
            ids = [operator.index(t) for t in token_ids]  # ints, numpy or torch integers; not floats
        except TypeError:
            raise StrataArgumentError(f"{what}: expected {expected}, found {token_ids!r:.80}") from None
        n = self.tokenizer.vocab_size
        for t in ids:
            if not 0 <= t < n:
                raise StrataError(f"token id {t} is outside the vocabulary [0, {n})")
        return ids

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The file's chat template (`tokenizer.chat_template`), or load's `chat_template` in its
        place, compiled on first use; None when absent. Raises ChatTemplateError (naming the file)
        when it is not a usable template."""
        override = self._template_override
        source = override if override is not None else self.model_file.metadata.get("tokenizer.chat_template")
        if self._chat_template is None and source is not None:
            from strata.chat_template import ChatTemplate, ChatTemplateError  # jinja2: only where a chat needs it

            try:
                self._chat_template = ChatTemplate(source, self._special_texts(),
                                                   key="chat_template" if override is not None else
                                                   "tokenizer.chat_template")
            except ChatTemplateError as e:
                where = "chat_template (given to load)" if override is not None else self.path
                raise ChatTemplateError(f"{where}: {e}") from None
        return self._chat_template

    def apply_chat_template(self, messages: Seq[dict[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        """The prompt text the model's chat template makes of `messages`."""
        if self.chat_template is None:
            raise StrataError(f"{self.path}: the file has no chat template (tokenizer.chat_template)")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)

    # -- logits --------------------------------------------------------------------------------

    def logits(self, token_ids: Seq[int], batch_size: int | None = None) -> torch.Tensor:
        """Logits [T, V] (float32, CPU) of every position of `token_ids`, as one fresh sequence,
        `batch_size` tokens per forward pass (None: all at once; 1: one at a time, as decoding)."""
        ids = self.check_token_ids(token_ids, "logits")
        if not 0 < len(ids) <= self.n_ctx:
            raise StrataError(f"logits of {len(ids)} tokens: expected 1 to n_ctx={self.n_ctx} tokens")
        step = len(ids) if batch_size is None else check_int("batch_size", batch_size, 1, None)
        slot, out = self.cache.allocate(), []
        try:
            for start in range(0, len(ids), step):
                piece = ids[start:start + step]
                batch = self.cache.batch([slot], [start], [len(piece)], self.device)
                tokens = torch.tensor(piece, dtype=torch.long, device=self.device)
                out.append(self.runner(tokens, batch, self.cache, all_logits=True).cpu())
                self.model_file.check_intact()  # a file cut short under the pass: its zeros are no logits
            return torch.cat(out)
        finally:
            self.cache.free(slot)

    def perplexity(self, token_ids: Seq[int], n_ctx: int | None = None, keep_logits: bool = False,
                   on_chunk: Callable[[ChunkDone], None] | None = None,
                   batch_size: int | None = None) -> PerplexityResult:
        """Perplexity of `token_ids` in chunks of `n_ctx` tokens, scored as llama.cpp's tool does;
        `on_chunk(ChunkDone)` after each chunk (the running PPL, for progress); `batch_size`: as `logits`'."""
        return perplexity(functools.partial(self.logits, batch_size=batch_size),
                          self.check_token_ids(token_ids, "perplexity"), n_ctx or self.n_ctx,
                          self.tokenizer.special.bos if self.tokenizer.special.add_bos else None, keep_logits, on_chunk)

    # -- generation ----------------------------------------------------------------------------

    def sampling_params(self, sampling: SamplingParams | None = None, **options: Any) -> SamplingParams:
        """The SamplingParams of a call: `sampling`, or the model's default (load's `sampling=`)
        with the keyword options given (SamplingParams' fields: sugar for one), not both."""
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise StrataArgumentError(f"sampling: expected a SamplingParams, found {sampling!r:.80}")
        unknown = sorted(set(options) - set(FIELDS))
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r} (sampling options: {', '.join(FIELDS)})")
        if sampling is not None and options:
            raise StrataArgumentError(f"{', '.join(options)}: give the sampling options in "
                                      f"sampling=SamplingParams(...) or as keywords, not both")
        return sampling or (replace(self.sampling, **options) if options else self.sampling)

    def grammar_vocab(self, params: SamplingParams) -> Vocabulary | None:
        """The tokenizer as the grammar engine reads it (built once: `prepare_grammar`), when
        `params` carry a grammar."""
        return self.prepare_grammar() if params.grammar is not None else None

    def prepare_grammar(self) -> Vocabulary:
        """Build the grammar engine's view of the tokenizer now (every token read: seconds on a
        150k vocabulary), so the first constrained request does not pay it; `strata serve` calls
        it on a thread at start. Later calls (and callers waiting on this one) get the same one."""
        return vocabulary(self.tokenizer, sorted(self.stop_token_ids))

    @property
    def grammar_ready(self) -> bool:
        """Whether the grammar vocabulary is built (a constrained request will not wait for it)."""
        return is_built(self.tokenizer, sorted(self.stop_token_ids))

    def _sequence(self, prompt: str | Seq[int], params: SamplingParams, add_special: bool = True) -> Sequence:
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special)
        else:
            ids = self.check_token_ids(prompt, "prompt", "text or a sequence of token ids")
        params.check_vocab(self.tokenizer.vocab_size)
        stops = stop_conditions(params, self.stop_token_ids, self.n_ctx - len(ids))
        return Sequence(next(self._ids), ids, params, stops, self.tokenizer.stream(), self.grammar_vocab(params))

    def generate(self, prompt: str | Seq[int], *, sampling: SamplingParams | None = None, stream: bool = False,
                 add_special: bool = True, **options: Any) -> Completion | Stream:
        """Continue `prompt` (text, tokenized with BOS as the file asks, or token ids).

        sampling: a `SamplingParams` (temperature, top_k, top_p, min_p, repetition_penalty, seed,
        max_tokens, stop, stop_token_ids, grammar, ...); or those options as keywords, over the model's default
        (`load(sampling=...)`; else SamplingParams(): the commands' rule, strata.defaults.SAMPLING_DEFAULTS:
        temperature 0.8, top_k 40, 256 tokens, a fresh seed). Greedy when temperature is 0. Generation ends
        at a stop token (default: the file's EOS and EOT), at a stop string, after `max_tokens`,
        or when the context is full. Returns a `Completion`, or with `stream=True` a `Stream` of
        `Chunk`s; with n > 1 (not streamed) a list of n Completions, choice i drawn with seed + i
        (the prompt is prefilled once: the other choices fork from the first's KV cache).
        """
        params = self.sampling_params(sampling, **options)
        if params.n > 1:
            if stream:
                raise StrataArgumentError(f"n={params.n}: stream one choice at a time (n=1)")
            seqs = [self._sequence(prompt, params.for_choice(i), add_special) for i in range(params.n)]
            return self._run([seqs[0], *(s.fork_from(seqs[0]) for s in seqs[1:])])
        seq = self._sequence(prompt, params, add_special)
        if stream:
            return Stream(self._run_stream(seq))
        return self._run([seq])[0]

    def generate_batch(self, prompts: Seq[str | Seq[int]], *, sampling: SamplingParams | None = None,
                       add_special: bool = True, **options: Any) -> list[Completion]:
        """`generate` for several prompts decoded together (up to `max_batch` at a time, the rest
        queued); the options apply to each. Greedy results equal those of each prompt alone."""
        params = self.sampling_params(sampling, **options)
        return self._run([self._sequence(p, params, add_special) for p in prompts])

    def chat(self, messages: Seq[dict[str, Any]], **kwargs: Any) -> Completion | Stream:
        """Generate the assistant's reply to `messages` (rendered with the chat template)."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Seq):
            raise StrataArgumentError(f"messages: expected a list of dicts with 'role' and 'content', "
                                      f"found {messages!r:.80}")
        prompt = self.apply_chat_template(messages, add_generation_prompt=True)
        return self.generate(prompt, add_special=False, **kwargs)

    def _step(self) -> None:
        """One engine step for every running sequence; chunks go to their streams' outboxes."""
        before = {s.seq_id: len(s.output_ids) for s in (*self.engine.running, *self.engine.waiting)}
        try:
            results = self.engine.step()
        except BaseException:
            self.engine.abort()  # a failed forward pass leaves the batch's caches half written
            raise
        now = time.perf_counter()
        for seq, text in results:
            self._first.setdefault(seq.seq_id, now)
            new = len(seq.output_ids) > before.get(seq.seq_id, 0)
            token = seq.output_ids[-1] if new else None  # None: stop token
            logprob = seq.logprobs[-1] if new and seq.logprobs else None
            self._outboxes.put(seq.seq_id, Chunk(token, text, seq.finish_reason, logprob))

    def _run(self, seqs: list[Sequence]) -> list[Completion]:
        t0 = time.perf_counter()
        try:
            for s in seqs:
                self.engine.add(s)  # EngineFull part way: the ones added are cancelled below
            while not all(s.finished for s in seqs):
                self._step()
        finally:
            for s in seqs:
                if not s.finished:  # interrupted (Ctrl-C): these sequences end, any others go on
                    self.engine.cancel(s)
        end = time.perf_counter()
        return [self._completion(s, t0, self._first.pop(s.seq_id, end), end) for s in seqs]

    def _run_stream(self, seq: Sequence) -> Iterator[Chunk]:
        t0 = time.perf_counter()
        self.engine.add(seq)
        box = self._outboxes.open(seq.seq_id)
        try:
            while box or not seq.finished:
                if box:
                    yield box.popleft()
                else:
                    self._step()
        finally:
            self._outboxes.close(seq.seq_id)
            t_first = self._first.pop(seq.seq_id, None)
            if not seq.finished:  # closed or dropped: this sequence ends, the others go on
                self.engine.cancel(seq)
        end = time.perf_counter()
        return self._completion(seq, t0, t_first or end, end)

    @staticmethod
    def _completion(seq: Sequence, t0: float, t_first: float, end: float) -> Completion:
        return Completion(seq.output_ids, seq.text, seq.finish_reason or "abort", len(seq.prompt_ids),
                          t_first - t0, end - t_first, seq.n_prompt_cached or 0, seq.logprobs)

    def memory_stats(self):
        """The expert memory's counters (`strata.memory.stats.MemoryStats`: hits and misses per
        tier, bytes moved, waits, prefetch precision and recall), or None for a memory without."""
        return self.memory.memory_stats() if self.memory is not None else None

    def expert_residency(self):
        """Which tier holds each routed expert now (`strata.memory.stats.Residency`), or None
        when the experts are read in place from the file (or the model has none)."""
        return self.memory.residency() if self.memory is not None else None

    def time_split(self) -> dict[str, float]:
        """Seconds per processed token since load (or `reset_time_split`): attention, expert
        compute, waiting for experts, dequantization and the rest, plus `tokens` and `total_s`.
        Expert compute is the routed experts' time less the memory's waits and dequantization."""
        t = self.runner.times()
        wait, dequant = (a - b for a, b in zip(self._memory_seconds(), self._split_base))
        n = max(t.tokens, 1)
        return {"tokens": t.tokens, "total_s": t.total_s, "attention": t.attention_s / n,
                "expert_compute": max(t.experts_s - wait - dequant, 0.0) / n, "expert_wait": wait / n,
                "dequantization": dequant / n, "other": max(t.total_s - t.attention_s - t.experts_s, 0.0) / n}

    def _memory_seconds(self) -> tuple[float, float]:
        """The memory's waits and dequantization so far (its counters are never reset)."""
        stats = self.memory_stats()
        return (0.0, 0.0) if stats is None else (float(stats.total("wait_s")), float(stats.total("dequant_s")))

    def reset_time_split(self) -> None:
        self.runner.reset_times()
        self._split_base = self._memory_seconds()

    def close(self) -> None:
        _close_all(self.runner, self.memory, self.model_file)

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(path: str | Path, *, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
         threads: int | None = None, n_ctx: int | None = None, max_batch: int = DEFAULT_SLOTS,
         memory: MemoryConfig | MemoryFactory | str | None = None, compute: str | None = None,
         sampling: SamplingParams | None = None, max_step_tokens: int = MAX_STEP_TOKENS,
         decoding_step_tokens: int | None = None,
         kv_blocks: int | None = None, max_waiting: int | None = None, chat_template: str | None = None,
         prefix_cache: bool = True, cache_ram: int | str | None = None, kv_type: str | None = DEFAULT_KV_TYPE,
         expert_parallel: Any = None, **memory_options: Any) -> Model:
    """Load the GGUF model at `path` for inference.

    device: "cpu", "cuda" or "cuda:N". dtype: compute dtype ("float32", "bfloat16", "float16";
    default float32 on the CPU, bfloat16 on CUDA). threads: CPU threads for dequantization and
    torch (default: all this process may use; sets torch's thread count for the process). n_ctx: context positions per sequence (default
    min(model's context, 4096)). max_batch: sequences decoded together.
    The KV cache is paged: a pool of `kv_blocks` blocks of 16 positions (default: enough for
    max_batch sequences of n_ctx positions) that sequences take as they grow and give back as
    they end. max_step_tokens: tokens one engine step processes at most (running decodes plus
    chunks of prompts being prefilled; prompts that arrive close together are prefilled in one
    step, up to this many); decoding_step_tokens: the same while sequences decode, if smaller (the
    longest pause a prompt puts in running streams; None: max_step_tokens). max_waiting: requests
    that may wait for a place in the batch (None: unbounded; past it `Engine.add` raises
    EngineFull). prefix_cache: share the KV blocks of a prompt prefix computed before (a system
    prompt, the earlier turns of a chat) across requests by content hash, so they are not
    prefilled again (`strata.engine.kv_cache`).
    cache_ram: room for the prefix cache beyond the sequences' blocks, added to the pool, so prompts
    stay cached while other requests run (llama-server's --cache-ram): bytes or a size ("2G"),
    "auto" (8 GiB, at most an eighth of the available RAM, on the CPU; none on CUDA), or None/0.
    On the CPU the pool's pages are taken as blocks are first used.
    kv_type: the KV cache's element type: "f32", "f16", "bf16", or "q8_0" (rows of Q8_0 blocks as
    llama.cpp's `--cache-type-k/v q8_0`: 34 bytes per 32 values, read natively by the CPU's decode
    attention); None: the compute dtype.
    memory: the expert memory: a `MemoryConfig` (its docstring lists each kind and its options),
    a kind's name ("tiered", "paged", "direct"), None (for packed compute on the CPU: direct when
    the file's experts fit the RAM budget and sit in the page cache, as a file just read or run
    does, else paged; tiered otherwise or when an option only the tiered memory has is given;
    `Model.plan` says which and why), or a factory
    (model_file, device, dtype, n_threads) -> ExpertMemory. The memory's options may also be given
    as keywords (device_mem=..., host_mem=..., prefetch_depth=..., slot_form=..., hybrid=...):
    sugar for the same MemoryConfig.
    compute: "packed" (the CPU default: weights stay in their GGUF blocks and the native quantized
    kernels multiply, activations rounded to 8-bit blocks as llama.cpp does), "float" (weights
    dequantized into `dtype`, torch multiplies: the reference path, and CUDA's), or "auto".
    sampling: the default `SamplingParams` of `generate` (default: SamplingParams(), which samples at
    temperature 0.8 with top_k 40 for 256 tokens as `strata generate` does; temperature=0 is greedy).
    chat_template: a jinja2 chat template (its text) that replaces the file's for `chat` and the server.
    expert_parallel: this process's rank of an expert-parallel group (`strata.distributed.ExpertParallel`):
    it computes only its shard of the routed experts and follows rank 0's sampled tokens.
    """
    dev = resolve_device(device)
    mode = resolve_compute(compute, dev, dtype)
    dt = resolve_dtype(dtype, dev)
    mem_config, memory_why = memory_config_for(memory, memory_options, mode)
    check_engine(dict(threads=threads, n_ctx=n_ctx, max_batch=max_batch, max_step_tokens=max_step_tokens,
                      decoding_step_tokens=decoding_step_tokens, kv_blocks=kv_blocks, max_waiting=max_waiting))
    if sampling is not None and not isinstance(sampling, SamplingParams):
        raise StrataArgumentError(f"sampling: expected a SamplingParams, found {sampling!r:.80}")
    if chat_template is not None and not isinstance(chat_template, str):
        raise StrataArgumentError(f"chat_template: expected the template's text (str), found {chat_template!r:.80}")
    if not isinstance(prefix_cache, bool):
        raise StrataArgumentError(f"prefix_cache: expected True or False, found {prefix_cache!r:.80}")
    if kv_type is not None and kv_type not in KV_TYPES:
        raise StrataArgumentError(f"kv_type: expected one of {', '.join(KV_TYPES)} or None, found {kv_type!r:.80}")
    n_threads = threads or native.default_threads()
    # Packed compute: the native pool owns the cores for every product; torch's remaining small ops
    # run on one thread so its workers do not contend with the pool's (benchmarks/RESULTS.md,
    # "Torch's threads beside the native pool").
    torch.set_num_threads(1 if mode == "packed" else n_threads)
    machine = Machine.measure(dev)  # the one measurement of RAM and device memory; budgets take it as data
    mf = open_model(path, guard=native.MapGuard)  # a file cut short under the model: an error, not SIGBUS
    mem = runner = None
    try:  # from here on every failure closes what was started: threads, pools, the file
        architecture(mf)  # an architecture Strata cannot run is the first thing to say
        # then a tensor type it cannot read, multiply packed, or (tiered memory on CUDA) dequantize on the
        # GPU: the sentence of inspect's verdict
        check_runs(mf, mode, cuda=dev.type == "cuda" and isinstance(mem_config, MemoryConfig)
                   and mem_config.kind == "tiered")
        hp = mf.hparams
        tokenizer = Tokenizer.from_metadata(mf.metadata, str(mf.path), vocab_size=hp.vocab_size)
        ctx = n_ctx or min(hp.context_length, DEFAULT_CTX)
        extra = prefix_cache_blocks(mf, dev, dt, cache_ram, kv_type, machine, prefix_cache)
        if expert_parallel is not None:  # the ranks run one schedule: one pool size, the least machine's
            extra = expert_parallel.least(extra)
        pool = (kv_blocks or max_batch * blocks_for(ctx)) + extra if extra else kv_blocks
        kv = kv_bytes(mf, dev, dt, ctx, max_batch, pool, machine, kv_type)
        if mf.expert_layers and expert_parallel is None:  # the CPU's packed default, from the file: mapped or paged
            # (an expert-parallel rank keeps the paged memory: it holds its shard, not the whole file)
            mem_config, memory_why = settle_default(memory, memory_options, mem_config, memory_why, mf, dev, dt, mode,
                                                    kv, machine)
        mem = expert_memory(mem_config, mf, dev, dt, n_threads, mode, kv, machine) if mf.expert_layers else None
        shards = None if expert_parallel is None else expert_parallel.shards(mf)  # refuses mismatched ranks
        runner = build_runner(mf, mem, device=dev, dtype=dt, n_threads=n_threads, compute=mode, memory_why=memory_why,
                              shards=shards)
        cache = kv_cache(mf, dev, dt, ctx, max_batch, pool, kv, prefix_cache, kv_type)
        model = Model(mf, runner, mem, cache, tokenizer, dev, dt, n_threads, max_step_tokens, max_waiting,
                      sampling=sampling, chat_template=chat_template,
                      agree=None if expert_parallel is None else expert_parallel.agree,
                      decoding_step_tokens=decoding_step_tokens)
        mf.check_intact()  # the resident weights were read whole
        if expert_parallel is not None:
            expert_parallel.ready()  # every rank loaded: from here the steps' timeout holds
        return model
    except BaseException:
        _close_all(runner, mem, mf)
        raise


def _close_all(runner: Runner | None, mem: ExpertMemory | None, mf: ModelFile) -> None:
    """Close a half-built model's parts (errors while closing would hide the first one)."""
    for part in (runner, mem, mf):
        try:
            if part is not None:
                part.close()
        except Exception:
            pass


__all__ = ["Chunk", "Completion", "Model", "Stream", "load", "resolve_compute", "resolve_device", "resolve_dtype"]
