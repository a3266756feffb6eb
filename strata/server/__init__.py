"""`strata serve`'s HTTP server: OpenAI-compatible endpoints on one engine thread.

Must not hold code: the package's public names, re-exported. Sits after strata.engine (it
calls only the engine's public API: `strata.load`, `Model`, `Engine.add/step/cancel/abort`).
"""
from .app import ServerConfig, create_app
from .errors import APIError
from .metrics import ServerMetrics

__all__ = ["APIError", "ServerConfig", "ServerMetrics", "create_app"]
