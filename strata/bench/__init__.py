"""Measurements of Strata's parts, one module per `strata bench` subcommand: `dequant` (kernel
GB/s), `cache` (placement policy on a routing trace beside LRU, fixed hot set, Belady), `pager`
(slab reads beside the disk's sequential rate), `tiered` (decoding with prefetch off and on).

Each returns plain data (dicts of numbers); `strata.commands.bench` and `benchmarks/` print it.
Measurements never assert. Nothing in the library imports this package.
"""
