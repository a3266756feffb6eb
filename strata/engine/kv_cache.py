"""The paged KV cache: one fixed pool of fixed-size blocks shared by every sequence.

Allocated once at start: per layer k and v of [N, Hkv, P, hd] (N blocks of P = `block_size`
positions) in the compute dtype on the device, or in the `kv_type` asked for: f32, f16, bf16, or
q8_0, rows of hd / 32 Q8_0 blocks (34 bytes: half d, int8 qs[32]; llama.cpp's
`--cache-type-k/v q8_0`) held as uint8 [N, Hkv, P, hd / 32 * 34]. A position's row is quantized
once when written (shared prefix blocks are never written again) and read back dequantized. A sequence holds a slot (a handle: at most
`n_slots` sequences at once) and a block table: position j of the sequence lives in block
`table[j // P]` at offset `j % P`. Blocks are taken from the free list as a sequence grows
(`reserve`) and all go back when it ends (`free`), so many short sequences and a few long ones
share the memory; `n_ctx` stays the most positions one sequence may hold.

Prefix cache (vLLM's automatic prefix caching, llama-server's prompt cache): a block whose P
positions are all computed is immutable, and is registered under its content hash, which chains
the previous block's hash with the block's token ids (`block_hash`), so one hash names a whole
prefix: the same tokens after a different prefix do not match. A new sequence whose first
blocks' hashes are registered takes those blocks into its table (`match`) and starts computing
after them. Blocks are refcounted: a block held by no table but registered stays cached
(evictable) until allocation needs room, then the least recently released goes first. Only full,
computed blocks are shared and a sequence writes only positions past its cached ones, so a
shared block is never written. Reuse goes on token by token past the whole blocks (llama-server's
prompt cache matches so): a sequence that ends keeps its last, partly filled block as a cached
tail (`keep_tail`), and a new sequence copies the positions that a cached block after its matched
prefix (whole, or a tail) shares with its next tokens into a block of its own (`match_partial`), so
a repeated prompt or the next turn of a chat computes only what is new.

Forks (the n choices of one request): once the first choice's prompt is computed, each other
choice's table takes that prompt's whole blocks (refcounted, as above) and a copy of its partial
last block (copy-on-write: both go on writing positions in it), so the prompt is prefilled once.

`BlockTables` is the bookkeeping alone (plain Python, no tensors), so the allocator and the
scheduler are tested without a model. Must not: compute attention or choose which sequence runs
(the scheduler does); it hands out and takes back blocks.
"""
from __future__ import annotations

import math

import hashlib
from array import array
from collections import OrderedDict
from typing import Sequence as Seq

import torch

from strata.defaults import KV_BLOCK_SIZE, KV_TYPES
from strata.errors import StrataError
from strata.models import Batch
from strata.quant import GGMLType, block_size
from strata.units import itemsize

#: Positions per block. A multiple of 8 that divides the native decode attention's 256-position
#: chunk, so paged decode attention sums in the same order as over one contiguous region.
BLOCK_SIZE = KV_BLOCK_SIZE


#: Per-sequence recurrent state of each recurrent layer: layer -> (conv state shape, ssm state shape).
StateShapes = dict[int, tuple[tuple[int, ...], tuple[int, ...]]]

#: Storage dtype of each float KV type; q8_0 rows are uint8 blocks.
_KV_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "q8_0": torch.uint8}
_Q8_0_ELEMS, _Q8_0_BYTES = block_size(GGMLType.Q8_0)  # values and bytes of a Q8_0 block


def kv_type_name(dtype: torch.dtype) -> str:
    """The --kv-type name of a cache storage dtype (uint8: q8_0)."""
    return {v: k for k, v in _KV_DTYPES.items()}.get(dtype, str(dtype).removeprefix("torch."))


def kv_storage(kv_type: str | None, dtype: torch.dtype, widths: Seq[int]) -> tuple[torch.dtype, list[int]]:
    """(storage dtype, row length in elements of each of `widths`) of a cache of `kv_type` (None:
    the compute dtype `dtype`); a one-line error naming --kv-type for an unknown type or a q8_0
    row whose width is not a multiple of 32."""
    if kv_type is None:
        return dtype, list(widths)
    if kv_type not in _KV_DTYPES:
        raise StrataError(f"--kv-type {kv_type!r}: expected one of {', '.join(KV_TYPES)}")
    if kv_type != "q8_0":
        return _KV_DTYPES[kv_type], list(widths)
    bad = [w for w in widths if w % _Q8_0_ELEMS]
    if bad:
        raise StrataError(f"--kv-type q8_0: a cache row of {bad[0]} values is not a whole number of Q8_0 blocks "
                          f"of {_Q8_0_ELEMS}; use f16 or bf16 for this model")
    return torch.uint8, [w // _Q8_0_ELEMS * _Q8_0_BYTES for w in widths]


def blocks_for(n_positions: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks that hold `n_positions` positions."""
    return -(-n_positions // block_size)


def block_hash(parent: bytes, token_ids: Seq[int]) -> bytes:
    """The content hash of a full block: its prefix's hash (`parent`, b"" for the first block)
    chained with its token ids. BLAKE2b-128: a collision would hand a request another prompt's
    keys and values, so not Python's hash() (fixed for ints, so forgeable by a client)."""
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()


def block_hashes(token_ids: Seq[int], n_blocks: int, known: list[bytes], block_size: int = BLOCK_SIZE) -> list[bytes]:
    """The hashes of the first `n_blocks` full blocks of `token_ids`, extending `known` (the
    hashes of its first blocks, computed before) in place."""
    for i in range(len(known), n_blocks):
        known.append(block_hash(known[-1] if known else b"", token_ids[i * block_size:(i + 1) * block_size]))
    return known


class BlockTables:
    """Slots (sequence handles) and their block tables over a pool of `n_blocks` blocks, with the
    prefix cache over them (`prefix_cache=False`: blocks go straight back to the free list)."""

    def __init__(self, n_slots: int, n_ctx: int, n_blocks: int | None = None, block_size: int = BLOCK_SIZE,
                 prefix_cache: bool = True):
        if n_slots < 1 or n_ctx < 1 or block_size < 1:
            raise ValueError(f"KV cache: expected n_slots, n_ctx and block_size >= 1, found {n_slots}, {n_ctx}, "
                             f"{block_size}")
        self.n_slots, self.n_ctx, self.block_size = n_slots, n_ctx, block_size
        self.max_blocks = blocks_for(n_ctx, block_size)  # blocks of one full-context sequence
        self.n_blocks = n_slots * self.max_blocks if n_blocks is None else n_blocks
        if self.n_blocks < self.max_blocks:
            raise StrataError(f"KV cache: {self.n_blocks} blocks of {block_size} positions cannot hold one sequence "
                              f"of n_ctx={n_ctx} ({self.max_blocks} blocks)")
        self._free_slots = list(range(n_slots - 1, -1, -1))  # popped from the end: lowest first
        self._free_blocks = list(range(self.n_blocks - 1, -1, -1))
        self.tables: dict[int, list[int]] = {}  # slot -> its blocks, in position order
        self.prefix_cache = prefix_cache
        self._refs = [0] * self.n_blocks  # tables holding each block
        self._cached: dict[bytes, int] = {}  # content hash -> block (full blocks)
        self._hash_of: dict[int, bytes] = {}  # block -> its content hash (registered full blocks only)
        # every registered block, full or a tail: block -> (its prefix's hash, its tokens), and the
        # blocks after each prefix by their first token (what `match_partial` searches)
        self._entry: dict[int, tuple[bytes, tuple[int, ...]]] = {}
        self._children: dict[tuple[bytes, int], set[int]] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, held by no table: LRU first
        self.n_queried = 0  # prompt tokens looked up in the prefix cache since start
        self.n_hit = 0  # of which found cached

    @property
    def n_free(self) -> int:
        """Free slots."""
        return len(self._free_slots)

    @property
    def n_free_blocks(self) -> int:
        """Blocks allocation may take: free ones and cached ones no table holds (evicted on demand)."""
        return len(self._free_blocks) + len(self._evictable)

    @property
    def n_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (held by tables or not)."""
        return len(self._cached)

    @property
    def n_used_blocks(self) -> int:
        return self.n_blocks - self.n_free_blocks

    def allocate(self) -> int:
        """A free slot (the lowest-numbered one), with an empty block table."""
        if not self._free_slots:
            raise StrataError(f"KV cache: all {self.n_slots} sequence slots are in use")
        slot = self._free_slots.pop()
        self.tables[slot] = []
        return slot

    def table(self, slot: int) -> list[int]:
        if slot not in self.tables:
            raise ValueError(f"KV cache: slot {slot} is not allocated")
        return self.tables[slot]

    def blocks_needed(self, slot: int, n_positions: int) -> int:
        """More blocks `slot` needs to hold positions 0..n_positions-1."""
        return max(0, blocks_for(n_positions, self.block_size) - len(self.table(slot)))

    def can_reserve(self, slot: int, n_positions: int) -> bool:
        return self.blocks_needed(slot, n_positions) <= self.n_free_blocks

    def reserve(self, slot: int, n_positions: int) -> bool:
        """Grow `slot`'s table to hold n_positions positions: all the blocks or none (False when the
        pool has too few free blocks)."""
        if n_positions > self.n_ctx:
            raise StrataError(f"KV cache: {n_positions} positions exceed n_ctx={self.n_ctx}")
        need = self.blocks_needed(slot, n_positions)
        if need > self.n_free_blocks:
            return False
        table = self.tables[slot]
        for _ in range(need):
            table.append(self._take())
        return True

    def _take(self) -> int:
        """A block for a table: a free one, else the least recently released cached one (evicted)."""
        if self._free_blocks:
            block = self._free_blocks.pop()
        else:
            block, _ = self._evictable.popitem(last=False)
            self._forget(block)
        self._refs[block] = 1
        return block

    def _register(self, block: int, parent: bytes, token_ids: Seq[int]) -> None:
        self._entry[block] = (parent, tuple(token_ids))
        self._children.setdefault((parent, token_ids[0]), set()).add(block)

    def _forget(self, block: int) -> None:
        """Unregister a cached block (evicted, or the cache cleared)."""
        parent, tokens = self._entry.pop(block)
        key = (parent, tokens[0])
        self._children[key].discard(block)
        if not self._children[key]:
            del self._children[key]
        h = self._hash_of.pop(block, None)
        if h is not None:
            del self._cached[h]

    def match(self, slot: int, hashes: Seq[bytes]) -> int:
        """Put the cached blocks of the longest registered prefix of `hashes` (a sequence's full
        blocks, first to last) into `slot`'s empty table; returns how many. Their positions are
        computed: the sequence starts after them."""
        table = self.table(slot)
        if table:
            raise ValueError(f"KV cache: slot {slot} already holds {len(table)} blocks; a prefix is matched first")
        for h in hashes if self.prefix_cache else ():
            block = self._cached.get(h)
            if block is None:
                break
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
            table.append(block)
        return len(table)

    def match_partial(self, slot: int, parent: bytes, token_ids: Seq[int]) -> int:
        """After `match`: the longest run m >= 1 of `token_ids` (at most one block's worth: the
        positions after the prefix whose hash is `parent`, b"" for none) that a registered block
        after that prefix starts with, a full block or a tail (`keep_tail`). Its first m positions
        are copied into a new last block of `slot`'s table (the sequence writes on after them, so
        the registered block is not written); returns m, 0 when none matches or no block is free."""
        if not self.prefix_cache or not token_ids:
            return 0
        best, m = None, 0
        for block in self._children.get((parent, token_ids[0]), ()):
            tokens = self._entry[block][1]
            n = next((i for i, (a, b) in enumerate(zip(tokens, token_ids)) if a != b), min(len(tokens), len(token_ids)))
            if n > m:
                best, m = block, n
        if best is None:
            return 0
        pinned = best in self._evictable  # its copy must not evict it
        if pinned:
            del self._evictable[best]
        try:
            if not self.n_free_blocks:
                return 0
            self.table(slot).append(self._take())
            self.copy_block(best, self.table(slot)[-1], m)
        finally:
            if pinned:
                self._evictable[best] = None  # released again, as the most recently used
        return m

    def keep_tail(self, slot: int, parent: bytes, token_ids: Seq[int]) -> None:
        """Before `slot` is freed: keep its last block, partly filled with the computed positions of
        `token_ids` after the prefix whose hash is `parent`, as a cached tail (evictable once freed),
        so a later prompt that goes on the same way starts after them (`match_partial`). Not kept:
        a block another table shares, or tokens a registered block already starts with."""
        table = self.table(slot)
        if not self.prefix_cache or not table or not 0 < len(token_ids) < self.block_size:
            return
        block = table[-1]
        if block in self._entry or self._refs[block] != 1:
            return
        for other in self._children.get((parent, token_ids[0]), ()):
            if self._entry[other][1][:len(token_ids)] == tuple(token_ids):
                return
        self._register(block, parent, token_ids)

    def fork(self, src: int, dst: int, n_positions: int) -> bool:
        """Give `dst`'s empty table the first `n_positions` positions of `src`'s: its whole blocks
        shared (neither writes them again: both write only past n_positions), its partial last
        block copied (`copy_block`). False, and nothing taken, when no block is free for the copy."""
        table, n_full, partial = self.table(dst), n_positions // self.block_size, n_positions % self.block_size
        if table:
            raise ValueError(f"KV cache: slot {dst} already holds {len(table)} blocks; a fork starts empty")
        source = self.table(src)
        if len(source) < blocks_for(n_positions, self.block_size):
            raise ValueError(f"KV cache: slot {src} holds {len(source)} blocks, fewer than {n_positions} positions")
        if partial and not self.n_free_blocks:
            return False
        for block in source[:n_full]:  # held by src: refcount > 0, so never in the evictable list
            self._refs[block] += 1
            table.append(block)
        if partial:
            table.append(self._take())
            self.copy_block(source[n_full], table[-1], partial)
        return True

    def copy_block(self, src_block: int, dst_block: int, n_positions: int) -> None:
        """Copy the first `n_positions` positions of a block into another (bookkeeping has no data:
        `KVCache` copies its keys and values)."""

    def commit(self, slot: int, hashes: Seq[bytes], token_ids: Seq[int], start: int = 0) -> None:
        """Register `slot`'s blocks start..len(hashes)-1 (full and computed: positions of
        `token_ids`) under their content hashes (`hashes[i]`: block i's). A block already
        registered, or whose hash names another block (two sequences computed the same prefix at
        once), is left as it is."""
        if not self.prefix_cache:
            return
        table, P = self.table(slot), self.block_size
        for i in range(start, len(hashes)):
            block, h = table[i], hashes[i]
            if block not in self._entry and h not in self._cached:
                self._cached[h], self._hash_of[block] = block, h
                self._register(block, hashes[i - 1] if i else b"", token_ids[i * P:(i + 1) * P])

    def free(self, slot: int) -> None:
        """Give back the slot and every block it holds."""
        if not 0 <= slot < self.n_slots or slot not in self.tables:
            raise ValueError(f"KV cache: slot {slot} is not allocated")
        self.release(slot)
        del self.tables[slot]
        self._free_slots.append(slot)
        self._free_slots.sort(reverse=True)

    def release(self, slot: int) -> None:
        """Give back the blocks of `slot` and keep the slot (a preempted sequence starts over).
        A registered block no table holds any more stays cached, evictable; the tail of a prefix
        is released first, so it is evicted before the blocks it depends on."""
        for block in reversed(self.table(slot)):
            self._refs[block] -= 1
            if self._refs[block]:
                continue
            if block in self._entry:
                self._evictable[block] = None
            else:
                self._free_blocks.append(block)
        self.tables[slot] = []

    def clear_cache(self) -> None:
        """Forget every cached block no table holds (they become free)."""
        for block in self._evictable:
            self._forget(block)
            self._free_blocks.append(block)
        self._evictable.clear()


class KVCache(BlockTables):
    """The block pool's tensors plus its bookkeeping (`BlockTables`)."""

    def __init__(self, n_layers: int, n_slots: int, n_ctx: int, n_head_kv: int | Seq[int], head_dim: int,
                 head_dim_v: int | None = None, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", n_blocks: int | None = None, block_size: int = BLOCK_SIZE,
                 prefix_cache: bool = True, kv_type: str | None = None, states: StateShapes | None = None):
        # a recurrent layer's state sums the whole prefix: a cached block's keys cannot stand in for it
        super().__init__(n_slots, n_ctx, n_blocks, block_size, prefix_cache and not states)
        N, P = self.n_blocks, block_size
        widths = (head_dim, head_dim if head_dim_v is None else head_dim_v)  # values 0: none (MLA)
        store, (row_k, row_v) = kv_storage(kv_type, dtype, widths)
        self.states = dict(states or {})  # layer -> (conv, ssm) state shapes of one sequence
        heads = _layer_heads(n_head_kv, n_layers)

        # On the CPU the pool is left unwritten, so the OS gives its pages as blocks are first used
        # (a large prefix-cache budget costs nothing until it fills), and each block is zeroed when
        # first taken: attention may read the unwritten positions of a block (masked), never garbage.
        lazy = torch.device(device).type == "cpu"
        self._unused = bytearray(b"\1" * N) if lazy else bytearray(N)  # blocks never taken yet
        blank = torch.empty if lazy else torch.zeros

        def pair(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            if i in self.states:  # per slot, float32 whatever the KV type: the recurrence accumulates in it
                return tuple(torch.zeros((n_slots, *shape), dtype=torch.float32, device=device)
                             for shape in self.states[i])
            return (blank((N, heads[i], P, row_k), dtype=store, device=device),
                    blank((N, heads[i], P, row_v), dtype=store, device=device))

        self.k, self.v = (list(t) for t in zip(*(pair(i) for i in range(n_layers))))
        self.device = torch.device(device)
        self.kv_type = kv_type_name(store)
        kv_heads = sum(h for i, h in enumerate(heads) if i not in self.states)
        self.bytes_per_token = kv_heads * (row_k + row_v) * torch.empty((), dtype=store).element_size()

    def _take(self) -> int:
        block = super()._take()
        if self._unused[block]:
            self._unused[block] = 0
            for i, (k, v) in enumerate(zip(self.k, self.v)):
                if i not in self.states:
                    k[block].zero_()
                    v[block].zero_()
        return block

    def free(self, slot: int) -> None:
        """Give back the slot, its blocks, and its rows of recurrent state (zeroed)."""
        super().free(slot)
        for i in self.states:
            self.k[i][slot].zero_()
            self.v[i][slot].zero_()

    @staticmethod
    def bytes_for(n_layers: int, n_slots: int, n_ctx: int, n_head_kv: int | Seq[int], head_dim: int,
                  head_dim_v: int | None = None, dtype: torch.dtype = torch.float32, n_blocks: int | None = None,
                  block_size: int = BLOCK_SIZE, kv_type: str | None = None, states: StateShapes | None = None) -> int:
        """Bytes a cache of these dimensions takes (before it is allocated): `n_blocks` blocks, by
        default enough for `n_slots` sequences of `n_ctx` positions each, for the layers that are not
        recurrent, and each recurrent layer's float32 state (`states`) for each of the `n_slots`."""
        store, rows = kv_storage(kv_type, dtype, (head_dim, head_dim if head_dim_v is None else head_dim_v))
        n = n_slots * blocks_for(n_ctx, block_size) if n_blocks is None else n_blocks
        states = states or {}
        state = sum(math.prod(shape) for pair in states.values() for shape in pair) * 4  # float32
        if isinstance(n_head_kv, int):  # one count for every layer: no per-layer tuple (a file may claim 2^31 layers)
            kv_heads = n_head_kv * (n_layers - sum(1 for i in states if 0 <= i < n_layers))
        else:
            kv_heads = sum(h for i, h in enumerate(_layer_heads(n_head_kv, n_layers)) if i not in states)
        return kv_heads * n * block_size * sum(rows) * itemsize(store) + n_slots * state

    def fork(self, src: int, dst: int, n_positions: int) -> bool:
        """`BlockTables.fork`, and `dst` takes a copy of `src`'s recurrent state (it sums the whole
        prefix, so the choices go on from the same state and diverge from then on)."""
        if not super().fork(src, dst, n_positions):
            return False
        for i in self.states:
            self.k[i][dst] = self.k[i][src]
            self.v[i][dst] = self.v[i][src]
        return True

    def copy_block(self, src_block: int, dst_block: int, n_positions: int) -> None:
        for i, (k, v) in enumerate(zip(self.k, self.v)):  # [N, Hkv, P, row] per layer; q8_0 rows copy as bytes
            if i in self.states:  # per slot, not per block: `fork` copies it
                continue
            k[dst_block, :, :n_positions] = k[src_block, :, :n_positions]
            v[dst_block, :, :n_positions] = v[src_block, :, :n_positions]

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    def batch(self, slots: list[int], starts: list[int], lengths: list[int],
              device: torch.device | str | None = None) -> Batch:
        """A model `Batch` of these slots' new tokens; blocks are reserved for them first (a
        StrataError when the pool has too few free blocks)."""
        for slot, start, n in zip(slots, starts, lengths):
            if not self.reserve(slot, start + n):
                raise StrataError(f"KV cache: no free blocks for {start + n} positions of slot {slot} "
                                  f"({self.n_free_blocks} of {self.n_blocks} free)")
        return Batch.make([self.table(s) for s in slots], starts, lengths, self.block_size,
                          self.device if device is None else device, slots=slots)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def _layer_heads(n_head_kv: int | Seq[int], n_layers: int) -> tuple[int, ...]:
    """Each layer's kv heads: one count for every layer, or one per layer (mimo2)."""
    if isinstance(n_head_kv, int):
        return (n_head_kv,) * n_layers
    if len(n_head_kv) != n_layers:
        raise ValueError(f"kv heads per layer: {len(n_head_kv)} counts for {n_layers} layers")
    return tuple(n_head_kv)


__all__ = ["BLOCK_SIZE", "BlockTables", "KVCache", "block_hash", "block_hashes", "blocks_for", "kv_storage",
           "kv_type_name"]

