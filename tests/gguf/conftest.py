"""Session-wide tiny model files, one per fixture writer (written once, read by every test)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .fixtures import WRITERS


@pytest.fixture(scope="session")
def model_files(tmp_path_factory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Fixture name -> (path of the written file, hparams it was written with)."""
    root = tmp_path_factory.mktemp("gguf-models")
    return {name: (path, write(path)) for name, write in WRITERS.items() for path in [root / f"{name}.gguf"]}
