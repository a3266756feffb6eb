"""Strata: Mixture-of-Experts inference with tiered expert memory (device, host RAM, NVMe).

Must not import the engine (or torch) at import time: `load` imports it on first call.
"""

__version__ = "0.1.0"


def load(path, **kwargs):
    """Load a GGUF model for inference: see `strata.engine.api.load` (imported lazily, so that
    `import strata` stays light for commands that do not run models)."""
    from strata.engine import load as _load

    return _load(path, **kwargs)
