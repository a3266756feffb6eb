"""Strata: Mixture-of-Experts inference with tiered expert memory (device, host RAM, NVMe)."""

__version__ = "0.1.0"
