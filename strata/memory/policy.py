"""Placement and eviction of experts in the device slot pool: plain data, no tensors.

The memory system owns the bytes; this module only decides which expert lives in which slot, so
it can be tested and replayed against a routing trace without a model (`strata bench cache`).

Pool layout. One global pool of `sum(budgets)` slots, split once at construction into per-layer
budgets: layer L owns slots `[first_slot[L], first_slot[L + 1])` for life. Per-layer budgets
guarantee that every layer can always hold its top-k (a global free-for-all lets a hot layer starve
a cold one and turns one token's acquire into a cross-layer eviction storm); they may differ per
layer. The page table `(layer, expert) -> slot` is global slot ids, so the device mirror needs no
per-layer offsets.

Slot life cycle: FREE -> `admit` -> LOADING -> `complete` -> READY -> evicted by a later `admit`
(or `cancel` -> FREE when a load fails). A LOADING slot is never a victim (the copy is in flight),
nor is a pinned slot (`pin`/`unpin` bracket the compute that reads it). The page table holds
LOADING entries too: it records reservations, and the engine waits for a load's completion event
before a kernel reads that slot.

Scoring. Each (layer, expert) keeps an exponentially decayed use count (the CRF of LRFU, Lee et
al. 2001): one number that is LFU for a long half-life and LRU for a short one, so one knob sets
the frequency/recency balance and the hot set follows drifting traffic. Divided by the decayed
number of steps it is a use rate in [0, 1]: the chance the expert is needed at the layer's next
step. Hints (`hint`) carry a predictor's probability that an expert is needed at the layer's
*next* step; an expert's keep value is max(rate, hint), so predicted experts are protected until
that step's routing is recorded. The victim is the unpinned READY slot of least keep value.
Experts of the running step are pinned by the engine; once released, the ones just used carry the
freshest count. That recency protection is deliberately mild (half-life 128 steps, not LRU's
one): on the trace, token-to-token reuse within a layer is near chance (0.106 against 0.094).
Prefetches (`admit_prefetch`) only displace an expert whose keep value is clearly below the
prefetched expert's probability, so wrong predictions cost a load, never a hot expert.

Nothing here allocates in proportion to traffic: every array is sized at construction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from strata.errors import StrataError

from .budget import DEFAULT_PREFETCH_MARGIN

FREE, LOADING, READY = 0, 1, 2
_STATE_NAMES = {FREE: "free", LOADING: "loading", READY: "ready"}


class PoolExhaustedError(StrataError):
    """No slot of a layer can take a new expert: every one is pinned or has a load in flight."""


@dataclass(frozen=True)
class PolicyConfig:
    """Tuning knobs; defaults chosen on the FLAME-MoE trace (`strata bench cache`).

    half_life_steps: decay of use counts, in steps of one layer (tokens at batch 1). Hit rates
        move by under 0.01 between 64 and 512 on the trace; shorter follows drift faster.
    prefetch_margin: a prefetch of probability p displaces only keep values below p / margin;
        default and reasons: `budget.DEFAULT_PREFETCH_MARGIN` (decoding) and
        `budget.REPLAY_PREFETCH_MARGIN` (co-occurrence alone, in the trace replay).
    prior_weight: seeded routing counts (`seed_counts`) weigh as this many steps of history.
    """

    half_life_steps: float = 128.0
    prefetch_margin: float = DEFAULT_PREFETCH_MARGIN
    prior_weight: float = 64.0


class ExpertPolicy:
    """Which expert occupies which slot of a fixed pool; see the module docstring.

    Arrays (E = n_experts, S = total slots), all allocated here and never resized:
      page_table  int32 [L, E]  slot of (layer, expert), -1 when not resident
      slot_expert int32 [S]     expert held by each slot, -1 when free
      slot_state  int8  [S]     FREE / LOADING / READY
      slot_pins   int32 [S]     pin count
    """

    def __init__(self, n_layers: int, n_experts: int, slots_per_layer: int | Sequence[int],
                 top_k: int | None = None, config: PolicyConfig | None = None) -> None:
        self.n_layers, self.n_experts = _positive("n_layers", n_layers), _positive("n_experts", n_experts)
        self.config = config or PolicyConfig()
        if not (self.config.half_life_steps > 0 and self.config.prefetch_margin > 0 and self.config.prior_weight > 0):
            raise StrataError(f"policy config: half-life, prefetch margin and prior weight must be "
                              f"positive, found {self.config}")
        self.budgets = _budgets(slots_per_layer, n_layers, n_experts, top_k)  # [L]
        self.first_slot = np.zeros(n_layers + 1, dtype=np.int64)  # [L+1]
        np.cumsum(self.budgets, out=self.first_slot[1:])
        n_slots = int(self.first_slot[-1])
        self.page_table = np.full((n_layers, n_experts), -1, dtype=np.int32)  # [L, E]
        self.slot_expert = np.full(n_slots, -1, dtype=np.int32)  # [S]
        self.slot_state = np.zeros(n_slots, dtype=np.int8)  # [S]
        self.slot_pins = np.zeros(n_slots, dtype=np.int32)  # [S]
        self._decay = 0.5 ** (1.0 / self.config.half_life_steps)
        self._counts = np.zeros((n_layers, n_experts), dtype=np.float64)  # [L, E] decayed uses
        self._steps = np.zeros(n_layers, dtype=np.float64)  # [L] decayed steps
        self._hints = np.zeros((n_layers, n_experts), dtype=np.float64)  # [L, E] P(needed next step)
        self._layers_checked = b""  # the bytes of the last layers record_layers checked
        self._keep = np.empty(int(self.budgets.max()), dtype=np.float64)  # scratch for victim search

    # ---- queries -------------------------------------------------------------------------------

    @property
    def n_slots(self) -> int:
        return int(self.first_slot[-1])

    def lookup(self, layer: int, expert: int) -> int | None:
        """Slot reserved for (layer, expert), loaded or loading; None when not resident."""
        slot = int(self.page_table[self._layer(layer), self._expert(expert)])
        return None if slot < 0 else slot

    def is_ready(self, slot: int) -> bool:
        return int(self.slot_state[slot]) == READY

    def resident(self, layer: int) -> np.ndarray:
        """Expert ids resident (or loading) in `layer`'s slots, sorted."""  # [<= budget]
        lo, hi = self._slot_range(self._layer(layer))
        held = self.slot_expert[lo:hi]
        return np.sort(held[held >= 0])

    def use_rate(self, layer: int) -> np.ndarray:
        """Decayed share of the layer's recent steps that used each expert."""  # [E]
        steps = self._steps[self._layer(layer)]
        return self._counts[layer] / steps if steps > 0 else np.zeros(self.n_experts)

    # ---- statistics ----------------------------------------------------------------------------

    def seed_counts(self, counts: np.ndarray, n_tokens: int) -> None:
        """Initial routing statistics: `counts` [L, E] uses of each expert over `n_tokens` tokens
        (GGUF `strata.*` metadata, or a warm-up). They weigh as `prior_weight` steps of history and
        then decay like any other."""
        counts = np.asarray(counts, dtype=np.float64)
        if counts.shape != self._counts.shape or (counts < 0).any() or n_tokens <= 0:
            raise StrataError(f"initial routing counts: expected non-negative [{self.n_layers}, "
                              f"{self.n_experts}] over a positive token count, found shape "
                              f"{list(counts.shape)} over {n_tokens} tokens")
        np.multiply(counts, self.config.prior_weight / n_tokens, out=self._counts)
        self._steps[:] = self.config.prior_weight

    def initial_placement(self) -> list[tuple[int, int]]:
        """(layer, expert) pairs to load at start-up: each layer's budget filled with its hottest
        experts by (seeded) count. The caller `admit`s and loads them."""
        order = np.argsort(-self._counts, axis=1, kind="stable")  # [L, E]
        return [(layer, int(e)) for layer in range(self.n_layers)
                for e in order[layer, :self.budgets[layer]] if self._counts[layer, e] > 0]

    def record(self, layer: int, expert_ids: np.ndarray) -> None:
        """The router chose `expert_ids` (any shape [..., K]; one step of `layer`, leading dims are
        tokens). Updates use counts and resolves the layer's pending hints."""
        layer = self._layer(layer)
        ids = self._experts(expert_ids)
        n_tokens = ids.size // ids.shape[-1] if ids.ndim else 1
        self._counts[layer] *= self._decay ** n_tokens
        np.add.at(self._counts[layer], ids.ravel(), 1.0)
        self._steps[layer] = self._steps[layer] * self._decay ** n_tokens + n_tokens
        self._hints[layer] = 0.0

    def record_layers(self, layers: np.ndarray, expert_ids: np.ndarray) -> None:
        """`record` of several distinct layers' steps at once (expert_ids [len(layers), T, K]), with
        the same counts to the bit."""
        layers = np.asarray(layers, dtype=np.int64)
        key = layers.tobytes()
        if key != self._layers_checked:  # a decode program passes the same layers step after step
            distinct = len(set(layers.tolist())) == layers.size
            if layers.size and (layers.min() < 0 or layers.max() >= self.n_layers or not distinct):
                raise StrataError(f"layers {layers.tolist()}: expected distinct layers in 0..{self.n_layers - 1}")
            self._layers_checked = key
        ids = self._experts(expert_ids)
        if ids.ndim != 3 or ids.shape[0] != layers.size:
            raise StrataError(f"expert ids of shape {list(ids.shape)}: expected [{layers.size}, T, K]")
        if not layers.size:
            return
        n_tokens = ids.shape[1]
        decay = self._decay ** n_tokens
        self._counts[layers] *= decay
        np.add.at(self._counts, (np.repeat(layers, ids[0].size), ids.reshape(-1)), 1.0)
        self._steps[layers] = self._steps[layers] * decay + n_tokens
        self._hints[layers] = 0.0

    def hint(self, layer: int, expert_ids: np.ndarray, probs: np.ndarray | float = 1.0) -> None:
        """A predictor expects `expert_ids` at `layer`'s next step with probability `probs`:
        protects them from eviction until that step is recorded."""
        layer = self._layer(layer)
        ids = self._experts(expert_ids).ravel()
        p = np.broadcast_to(np.asarray(probs, dtype=np.float64), ids.shape)
        np.maximum.at(self._hints[layer], ids, np.clip(p, 0.0, 1.0))

    def hits_first(self, layer: int, expert_ids: Sequence[int]) -> list[int]:
        """Positions of `expert_ids` in the order a step reserves them: the resident ones first, so
        pinning them before any miss is admitted keeps a miss from evicting an expert the same
        step needs; then the misses, each group in the order given."""
        layer = self._layer(layer)
        resident = [self.page_table[layer, self._expert(e)] >= 0 for e in expert_ids]
        return [i for i, r in enumerate(resident) if r] + [i for i, r in enumerate(resident) if not r]

    def announce(self, layer: int, expert_ids: np.ndarray, probs: np.ndarray) -> list[tuple[int, float, tuple | None]]:
        """A predictor's experts for `layer`'s next step (most likely first): hint them all, then
        `admit_prefetch` each one not resident, in order. Returns (expert, prob, the admission:
        (slot, evicted) or None when refused) per expert that was not resident; the caller loads
        the admitted ones. Once one is refused the rest, less likely, would be too: they are
        returned refused without asking."""
        layer = self._layer(layer)
        self.hint(layer, expert_ids, probs)
        out, refused = [], False
        for e, p in zip(np.asarray(expert_ids).tolist(), np.asarray(probs, dtype=np.float64).tolist()):
            if self.page_table[layer, e] >= 0:
                continue
            admitted = None if refused else self.admit_prefetch(layer, e, p)
            refused = refused or admitted is None
            out.append((e, p, admitted))
        return out

    # ---- slot life cycle -----------------------------------------------------------------------

    def admit(self, layer: int, expert: int) -> tuple[int, int | None]:
        """Reserve a slot for a demanded (layer, expert) not yet resident: a free slot, else the
        victim of least keep value. Returns (slot, evicted expert or None); the slot is LOADING
        until `complete`. Raises PoolExhaustedError when every slot is pinned or loading."""
        layer, expert = self._layer(layer), self._expert(expert)
        self._check_absent(layer, expert)
        slot = self._free_slot(layer)
        if slot is None:
            slot, _ = self._victim(layer)
            if slot is None:
                raise PoolExhaustedError(self._exhausted_message(layer, expert))
        return slot, self._install(layer, expert, slot)

    def admit_prefetch(self, layer: int, expert: int, prob: float) -> tuple[int, int | None] | None:
        """Like `admit` for a predicted expert (needed with probability `prob`), but only into a
        free slot or over a victim worth less than prob / prefetch_margin; None when refused."""
        return self.admit_over(layer, expert, prob / self.config.prefetch_margin)

    def admit_over(self, layer: int, expert: int, value: float) -> tuple[int, int | None] | None:
        """Like `admit`, but only into a free slot or over a victim whose keep value is below
        `value`; None when refused (nothing changed)."""
        layer, expert = self._layer(layer), self._expert(expert)
        self._check_absent(layer, expert)
        slot = self._free_slot(layer)
        if slot is None:
            slot, keep = self._victim(layer)
            if slot is None or keep >= value:
                return None
        return slot, self._install(layer, expert, slot)

    def complete(self, layer: int, expert: int) -> int:
        """The load into (layer, expert)'s slot finished: LOADING -> READY. Returns the slot."""
        slot = self._slot_in_state(layer, expert, LOADING, "complete")
        self.slot_state[slot] = READY
        return slot

    def cancel(self, layer: int, expert: int) -> None:
        """A load failed or was abandoned: its slot goes back to FREE. Refused while pinned (a
        compute is waiting for that load)."""
        slot = self._slot_in_state(layer, expert, LOADING, "cancel")
        if self.slot_pins[slot]:
            raise StrataError(f"cancel: expert {expert} of layer {layer} is pinned "
                              f"{self.slot_pins[slot]} times; unpin before abandoning its load")
        self._release(layer, slot)

    def pin(self, layer: int, expert: int) -> int:
        """Hold (layer, expert) in place while compute reads it (counted). Returns the slot."""
        slot = self.lookup(layer, expert)
        if slot is None:
            raise StrataError(f"pin: expert {expert} of layer {layer} is not resident")
        self.slot_pins[slot] += 1
        return slot

    def ready_slots(self, layer: int, experts: Sequence[int]) -> np.ndarray | None:
        """The slots of `experts` when every one is READY (without pinning them), else None."""
        layer = self._layer(layer)
        if not experts or min(experts) < 0 or max(experts) >= self.n_experts:
            return None
        slots = self.page_table[layer, list(experts)]
        if (slots < 0).any() or (self.slot_state[slots] != READY).any():
            return None
        return slots

    def pin_ready(self, layer: int, experts: Sequence[int]) -> np.ndarray | None:
        """Pin every one of `experts` (distinct) at once when all are READY in their slots (the
        common step once the working set is resident); None, with nothing pinned, otherwise.
        Returns their slots, in the order given."""
        slots = self.ready_slots(layer, experts)
        if slots is not None:
            self.slot_pins[slots] += 1
        return slots

    def unpin_slots(self, layer: int, experts: Sequence[int], slots: Sequence[int]) -> None:
        """`unpin` of each of `experts` (distinct), pinned earlier in `slots` (pinned slots are
        never evicted, so they are still theirs)."""
        layer = self._layer(layer)
        slots = np.asarray(slots, dtype=np.int64)
        if (self.page_table[layer, list(experts)] != slots).any() or (self.slot_pins[slots] <= 0).any():
            raise StrataError(f"unpin: experts {list(experts)} of layer {layer} are not all pinned in slots "
                              f"{slots.tolist()}")
        self.slot_pins[slots] -= 1

    def unpin(self, layer: int, expert: int) -> None:
        slot = self.lookup(layer, expert)
        if slot is None or self.slot_pins[slot] == 0:
            raise StrataError(f"unpin: expert {expert} of layer {layer} is not pinned")
        self.slot_pins[slot] -= 1

    # ---- internals -----------------------------------------------------------------------------

    def _install(self, layer: int, expert: int, slot: int) -> int | None:
        old = int(self.slot_expert[slot])
        if old >= 0:
            self.page_table[layer, old] = -1
        self.slot_expert[slot] = expert
        self.slot_state[slot] = LOADING
        self.page_table[layer, expert] = slot
        return old if old >= 0 else None

    def _release(self, layer: int, slot: int) -> None:
        self.page_table[layer, self.slot_expert[slot]] = -1
        self.slot_expert[slot] = -1
        self.slot_state[slot] = FREE

    def _free_slot(self, layer: int) -> int | None:
        lo, hi = self._slot_range(layer)
        states = self.slot_state[lo:hi]
        i = int(np.argmin(states))  # FREE == 0 sorts first
        return lo + i if states[i] == FREE else None

    def _victim(self, layer: int) -> tuple[int | None, float]:
        """Unpinned READY slot of least keep value = max(use rate, hint); (None, inf) if none."""
        lo, hi = self._slot_range(layer)
        keep = self._keep[:hi - lo]  # [budget]
        experts = self.slot_expert[lo:hi]
        np.divide(self._counts[layer, experts], max(self._steps[layer], 1e-12), out=keep)
        np.maximum(keep, self._hints[layer, experts], out=keep)
        keep[(self.slot_state[lo:hi] != READY) | (self.slot_pins[lo:hi] > 0)] = np.inf
        i = int(np.argmin(keep))
        return (None, np.inf) if keep[i] == np.inf else (lo + i, float(keep[i]))

    def _slot_in_state(self, layer: int, expert: int, state: int, what: str) -> int:
        slot = self.lookup(layer, expert)
        if slot is None or self.slot_state[slot] != state:
            found = "not resident" if slot is None else _STATE_NAMES[int(self.slot_state[slot])]
            raise StrataError(f"{what}: expert {expert} of layer {layer} should be "
                              f"{_STATE_NAMES[state]}, found {found}")
        return slot

    def _check_absent(self, layer: int, expert: int) -> None:
        if self.page_table[layer, expert] >= 0:
            raise StrataError(f"admit: expert {expert} of layer {layer} is already in slot "
                              f"{self.page_table[layer, expert]}")

    def _exhausted_message(self, layer: int, expert: int) -> str:
        lo, hi = self._slot_range(layer)
        pinned = int((self.slot_pins[lo:hi] > 0).sum())
        loading = int((self.slot_state[lo:hi] == LOADING).sum())
        return (f"expert slot pool exhausted: layer {layer} needs a slot for expert {expert} but all "
                f"{hi - lo} of its slots are in use ({pinned} pinned, {loading} loading); raise the "
                f"layer's slot budget above the experts one step pins, or unpin before admitting")

    def _slot_range(self, layer: int) -> tuple[int, int]:
        return int(self.first_slot[layer]), int(self.first_slot[layer + 1])

    def _layer(self, layer: int) -> int:
        if not 0 <= layer < self.n_layers:
            raise StrataError(f"layer {layer} out of range: the policy has {self.n_layers} layers")
        return int(layer)

    def _expert(self, expert: int) -> int:
        if not 0 <= expert < self.n_experts:
            raise StrataError(f"expert {expert} out of range: layers have {self.n_experts} experts")
        return int(expert)

    def _experts(self, expert_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(expert_ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_experts):
            raise StrataError(f"expert ids out of range 0..{self.n_experts - 1}: found "
                              f"{int(ids.min())}..{int(ids.max())}")
        return ids.astype(np.int64, copy=False)


def _positive(name: str, value: int) -> int:
    if int(value) <= 0:
        raise StrataError(f"{name} must be positive, found {value}")
    return int(value)


def _budgets(slots_per_layer: int | Sequence[int], n_layers: int, n_experts: int,
             top_k: int | None) -> np.ndarray:
    budgets = np.array(slots_per_layer, dtype=np.int64, ndmin=1)
    if budgets.shape == (1,):
        budgets = np.repeat(budgets, n_layers)
    if budgets.shape != (n_layers,):
        raise StrataError(f"slots per layer: expected one int or {n_layers}, found {slots_per_layer!r}")
    floor = top_k or 1
    for layer, b in enumerate(budgets):
        if b < floor or b > n_experts:
            raise StrataError(f"slot budget of layer {layer} must be between {floor} (top-k experts "
                              f"of one step) and {n_experts} (all experts), found {int(b)}")
    return budgets
