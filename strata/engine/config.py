"""Configuration as data: the checks every option goes through, and the expert memory's config.

    MemoryConfig("paged", host_mem="8G") == memory_config("paged", {"host_mem": "8G"})
    memory_config(None, {"device_mem": "2G"}).kind == "tiered"  # an option only the tiered memory has

One validation per config type, shared by the API, the CLI and the server: each check raises an
`OptionError` (a one-line StrataArgumentError naming the option, what was expected and what was
found). Callers that spell options differently pass `names` (field -> the spelling: a command
line flag); the server reads `OptionError.option` to name the request field.

Must not: load, allocate or read a file (the memory constructors do; `to_tiered` hands them the
settings they take).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from strata.defaults import MAX_THREADS
from strata.errors import StrataArgumentError
from strata.memory.budget import BudgetError, TieredConfig, parse_bytes

Names = Mapping[str, str]


class OptionError(StrataArgumentError):
    """An option out of range; `option` is its field name (whatever spelling the message uses)."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


def _bound(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _range(low: float | None, high: float | None, low_open: bool) -> str:
    lo = "" if low is None else f"{'>' if low_open else '>='} {_bound(low)}"
    hi = "" if high is None else f"<= {_bound(high)}"
    return " and ".join(x for x in (lo, hi) if x)


def spell(field: str, names: Names | None) -> str:
    """The option `field` as the caller spells it (a flag), else its field name."""
    return (names or {}).get(field, field)


def check_number(name: str, value, low: float | None, high: float | None, low_open: bool = False,
                 field: str | None = None) -> float:
    """`value` as a float when it is a finite number in the range; else OptionError naming `name`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        raise OptionError(field or name, f"{name}: expected a finite number {_range(low, high, low_open)}, "
                                         f"found {value!r}")
    return float(value)


def check_int(name: str, value, low: int | None, high: int | None, field: str | None = None) -> int:
    """`value` when it is an integer in [low, high]; else OptionError naming `name`."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not (ok and (low is None or value >= low) and (high is None or value <= high)):
        raise OptionError(field or name, f"{name}: expected an integer {_range(low, high, False)}, found {value!r}")
    return value


def check_bytes(name: str, value, field: str | None = None) -> int | None:
    """A byte budget (an int, or a size such as '512M', '8G') as an int; None stays None."""
    try:
        return parse_bytes(value, name)
    except BudgetError:
        raise OptionError(field or name, f"{name}: expected a positive number of bytes such as 512M or 8G, "
                                         f"found {value!r}") from None


def check_choice(name: str, value, choices: tuple, field: str | None = None):
    if value not in choices:
        raise OptionError(field or name, f"{name}: expected one of {', '.join(map(repr, choices))}, found {value!r}")
    return value


#: load()'s engine options and their ranges (low, high); max_step_tokens is at least max_batch.
ENGINE_RANGES = {"threads": (1, MAX_THREADS), "n_ctx": (2, None), "max_batch": (1, 4096), "max_step_tokens": (1, None),
                 "decoding_step_tokens": (1, None),
                 "kv_blocks": (1, None), "max_waiting": (0, None)}


def check_engine(values: Mapping[str, Any], names: Names | None = None) -> None:
    """Check load()'s engine options (None or absent: the default); errors name them as `names` spells them."""
    for f, (low, high) in ENGINE_RANGES.items():
        if values.get(f) is not None:
            if f == "max_step_tokens" and values.get("max_batch") is not None:
                low = max(low, values["max_batch"])
            check_int(spell(f, names), values[f], low, high, f)


# -- the expert memory --------------------------------------------------------------------------

MEMORY_KINDS = ("tiered", "paged", "direct")
#: The options of each kind of expert memory (the others belong to another kind).
MEMORY_OPTIONS = {"tiered": ("device_mem", "host_mem", "prefetch_depth", "slot_form", "hybrid", "miss_stand_in",
                             "stand_in_mode"),
                  "paged": ("host_mem", "miss_stand_in", "stand_in_mode"), "direct": ()}
SLOT_FORMS = ("dequantized", "packed")


def _kind_name(kind: str, names: Names | None) -> str:
    """The kind as the caller spells the choice: memory='paged', or --memory paged."""
    flag = spell("memory", names)
    return f"{flag} {kind}" if flag.startswith("-") else f"{flag}={kind!r}"


def check_memory(values: dict[str, Any], names: Names | None = None) -> dict[str, Any]:
    """MemoryConfig's fields checked and normalised (budgets as bytes; the kind inferred as
    'tiered' when an option only it has is given). Each error names the option as `names` spells it."""
    out = dict(values)
    kind = out.get("kind")
    if kind is not None:
        check_choice(spell("memory", names), kind, MEMORY_KINDS, "kind")
    for f in ("device_mem", "host_mem"):
        out[f] = check_bytes(spell(f, names), out.get(f), f)
    if out.get("prefetch_depth") is not None:
        check_int(spell("prefetch_depth", names), out["prefetch_depth"], 0, None, "prefetch_depth")
    if out.get("slot_form") is not None:
        check_choice(spell("slot_form", names), out["slot_form"], SLOT_FORMS, "slot_form")
    if out.get("miss_stand_in") is not None or out.get("stand_in_mode") is not None:
        check_stand_in(out, names)
    if out.get("hybrid") is not None and not isinstance(out["hybrid"], bool):
        raise OptionError("hybrid", f"{spell('hybrid', names)}: expected True or False, found {out['hybrid']!r}")
    given = [f for f in MEMORY_OPTIONS["tiered"] if out.get(f) is not None]
    if kind is None and set(given) - set(MEMORY_OPTIONS["paged"]):
        kind = out["kind"] = "tiered"
    foreign = [f for f in given if kind is not None and f not in MEMORY_OPTIONS[kind]]
    if foreign:
        own = MEMORY_OPTIONS[kind]
        theirs = ", ".join(spell(f, names) for f in foreign)
        raise OptionError(foreign[0], f"{theirs}: options of {_kind_name('tiered', names)}, not of "
                                      f"{_kind_name(kind, names)} (its options: "
                                      f"{', '.join(spell(f, names) for f in own) or 'none'})")
    return out


def check_stand_in(out: dict[str, Any], names: Names | None) -> None:
    """miss_stand_in as a ggml type name ('Q2_K') and its mode, each error naming the option."""
    from strata.memory.standin import StandInError, check_stand_in_mode, stand_in_type

    if out.get("miss_stand_in") is None:
        raise OptionError("stand_in_mode", f"{spell('stand_in_mode', names)}: a mode of the miss stand-ins; "
                                           f"give {spell('miss_stand_in', names)} too")
    try:
        out["miss_stand_in"] = stand_in_type(out["miss_stand_in"]).name
    except StandInError as e:
        raise OptionError("miss_stand_in", f"{spell('miss_stand_in', names)}: {e}") from None
    if out.get("stand_in_mode") is not None:
        try:
            check_stand_in_mode(out["stand_in_mode"])
        except StandInError as e:
            raise OptionError("stand_in_mode", f"{spell('stand_in_mode', names)}: {e}") from None


@dataclass(frozen=True)
class MemoryConfig:
    """How experts are held: the kind of expert memory and the options of that kind.

    kind: "tiered" (device slots, host tier, pager, prefetch: `TieredExpertMemory`; the default on
    CUDA; with packed compute on the CPU the paged memory serves it: `backend`), "paged" (one pool
    of RAM slots the native kernels compute from: `PagedExpertMemory`; the default for packed
    compute on the CPU), "direct" (experts read from the mapped file at every
    use), or None (chosen at load from the compute mode; 'tiered' when an option only it has is given).
    Options by kind (another kind's option is refused, naming both):
      tiered: device_mem, host_mem (bytes or '512M', '8G'; device_mem covers resident weights and KV
              cache too), prefetch_depth (layers ahead, 0: off), slot_form ('dequantized' or
              'packed'), hybrid (CUDA: compute missed experts the host tier holds on the CPU);
              with packed compute on the CPU: host_mem plus device_mem less the resident weights
              and KV cache is the paged memory's budget; prefetch_depth > 0, slot_form
              'dequantized' and hybrid are refused there;
      paged:  host_mem (its one RAM tier's budget), miss_stand_in (a ggml type, 'q2_k': a resident
              low-bit copy of every expert, counted in the budget, computes a miss at once; off by
              default) and stand_in_mode ('background': the full expert is still read, not
              waited for; 'instead': it is not read); memory='tiered' takes them where the paged
              memory serves it;
      direct: none.
    None means the machine's default (strata.memory.budget).
    """

    kind: str | None = None
    device_mem: int | None = None
    host_mem: int | None = None
    prefetch_depth: int | None = None
    slot_form: str | None = None
    hybrid: bool | None = None
    miss_stand_in: str | None = None
    stand_in_mode: str | None = None

    def __post_init__(self) -> None:
        for f, v in check_memory(self.__dict__).items():
            object.__setattr__(self, f, v)

    @classmethod
    def build(cls, kind: str | None = None, names: Names | None = None, **options: Any) -> MemoryConfig:
        """The config of these options, errors naming them as `names` spells them (CLI flags)."""
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            raise OptionError(unknown[0], f"{unknown[0]}: not an option of the expert memory (expected "
                                          f"{', '.join(MEMORY_OPTIONS['tiered'])})")
        return cls(**check_memory({"kind": kind, **options}, names))

    def options(self) -> dict[str, Any]:
        """The options given (not None), by name."""
        return {f: getattr(self, f) for f in MEMORY_OPTIONS["tiered"] if getattr(self, f) is not None}

    def resolved(self, compute: str) -> MemoryConfig:
        """This config with its kind chosen: as given, else 'paged' for packed compute, else 'tiered'."""
        if self.kind is not None:
            return self
        return MemoryConfig.build("paged" if compute == "packed" else "tiered", **self.options())

    def backend(self, compute: str) -> str:
        """The kind of memory that serves this config: its kind, except that on the CPU with packed
        compute (the only place packed compute runs) the tiered memory's two tiers would both be
        RAM, so its options are served by the paged memory's one RAM tier (`ram_budget`)."""
        return "paged" if self.kind == "tiered" and compute == "packed" else self.kind

    def ram_budget(self, reserved: int) -> int | None:
        """The paged memory's one RAM budget when it serves memory='tiered': host_mem, plus
        device_mem less `reserved` (the resident weights and KV cache, which device_mem covers)
        when device_mem is given (on the CPU it is RAM too); None: the machine's default."""
        if self.device_mem is None:
            return self.host_mem
        left = self.device_mem - reserved
        if left <= 0 and not self.host_mem:
            raise OptionError("device_mem", f"device_mem={self.device_mem}: the resident weights and KV cache take "
                                            f"{reserved} bytes of it, nothing is left for experts; give a larger "
                                            f"device_mem or a host_mem")
        return max(left, 0) + (self.host_mem or 0)

    def to_tiered(self) -> TieredConfig:
        """The tiered memory's own config (its fields were checked here, by `check_memory`; TieredConfig
        checks only what a caller building one directly could get wrong)."""
        own = {f: v for f, v in self.options().items() if f not in ("miss_stand_in", "stand_in_mode")}
        return TieredConfig(**{**own, "hybrid": bool(self.hybrid)})


#: What the paged memory cannot do of the tiered memory's options, when it serves memory='tiered'
#: (packed compute on the CPU): the option's refused value, and why.
_NOT_PAGED = {
    "prefetch_depth": (lambda v: v > 0, "the paged memory reads experts on demand, without prefetch; give 0 or "
                                        "leave it out, or compute='float' for the tiered memory's prefetch"),
    "slot_form": (lambda v: v != "packed", "packed compute reads packed slots; give 'packed' or leave it out, or "
                                           "compute='float' for dequantized slots"),
    "hybrid": (bool, "packed compute already runs every expert on the CPU; hybrid splits them between a GPU and "
                     "the CPU (compute='float' on CUDA)"),
}


def check_memory_compute(config: MemoryConfig, compute: str) -> None:
    """Refuse a memory that cannot serve the compute mode, and options of memory='tiered' the paged
    memory cannot honour where it serves it (packed compute on the CPU; `MemoryConfig.backend`)."""
    if config.backend(compute) != "paged" and (config.miss_stand_in or config.stand_in_mode):
        raise OptionError("miss_stand_in", f"miss_stand_in: stand-ins serve the paged memory's misses (packed "
                                           f"compute on the CPU), not memory={config.kind!r} with compute={compute!r}")
    if config.kind == "paged" and compute != "packed":
        raise OptionError("kind", f"memory='paged' serves packed compute on the CPU (compute='packed'), "
                                  f"not compute={compute!r}; use the tiered memory")
    if config.backend(compute) != config.kind:
        for option, (refused, why) in _NOT_PAGED.items():
            value = getattr(config, option)
            if value is not None and refused(value):
                raise OptionError(option, f"{option}={value!r}: with packed compute on the CPU the paged memory "
                                          f"serves memory='tiered': {why}")


def memory_config(memory: MemoryConfig | str | None, options: Mapping[str, Any],
                  names: Names | None = None) -> MemoryConfig:
    """One MemoryConfig from the three spellings: a MemoryConfig (with no loose options beside it),
    a kind's name, or None, each with the keyword options (device_mem=..., host_mem=...)."""
    given = {k: v for k, v in options.items() if v is not None}
    if isinstance(memory, MemoryConfig):
        if given:
            theirs = ", ".join(spell(f, names) for f in given)
            raise OptionError(next(iter(given)), f"{theirs}: give the expert memory's options in the MemoryConfig "
                                                 f"or as keywords, not both")
        return memory
    if memory is not None and not isinstance(memory, str):
        raise OptionError("kind", f"{spell('memory', names)}: expected a MemoryConfig, one of "
                                  f"{', '.join(map(repr, MEMORY_KINDS))} or a factory, found {memory!r:.80}")
    return MemoryConfig.build(memory, names, **given)


__all__ = ["ENGINE_RANGES", "MEMORY_KINDS", "MEMORY_OPTIONS", "MemoryConfig", "OptionError", "check_bytes",
           "check_choice", "check_engine", "check_int", "check_memory", "check_memory_compute", "check_number",
           "memory_config", "spell"]
