"""A layer kind lives in its own files: its reader and classes register themselves
(strata.models.kinds), the loader, the executor's tables, the runtime and the decode program name no
kind, and build.py takes a kind's header into the cdef by its mark (docs/layout.md, "Adding things")."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata.models import kinds
from strata.models.spec import ATTENTION_KINDS, AttentionSpec, FfnSpec, LayerSpec

ROOT = Path(__file__).resolve().parents[2]

#: Files every kind shares: none may name a kind, its classes, readers or C step.
SHARED = ["strata/models/loader.py", "strata/models/executor/__init__.py", "strata/models/transformer.py",
          "strata/native/program.py", "native/executor/program.c", "build.py", *sorted(
              str(p.relative_to(ROOT)) for p in (ROOT / "strata/runtime").glob("*.py"))]


def _kind_words() -> set[str]:
    """The spec constants, the registered classes and readers, and the C step names of every kind."""
    words = {"GQA", "GATED", "CHUNKED", "MLA", "DELTANET", "DSA", "strata_decode_attn", "strata_decode_deltanet",
             "strata_attn_layer", "strata_deltanet_layer", "DecodeAttn", "DecodeDeltaNet"}
    for name in kinds.names():
        k = kinds.get(name)
        words |= {k.read.__name__, *(cls.__name__ for cls in k.classes.values())}
    return words


def test_every_kind_has_a_reader_and_both_implementations():
    assert kinds.names() == sorted(ATTENTION_KINDS)
    for name in ATTENTION_KINDS:
        k = kinds.get(name)
        assert set(k.classes) == {"torch", "native"}, name
        assert issubclass(k.classes["native"], k.classes["torch"]), name  # the executor refines the reference
    with pytest.raises(ValueError, match="no reader"):
        kinds.get("no-such-kind")


@pytest.mark.parametrize("path", SHARED)
def test_shared_files_name_no_kind(path):
    text = (ROOT / path).read_text()
    found = sorted(w for w in _kind_words() if re.search(rf"\b{re.escape(w)}\b", text))
    assert not found, f"{path} names layer kinds {found}: a kind's code belongs in its own files"


def test_a_kind_registered_in_its_own_module_is_built_without_the_loader_knowing_it():
    """A kind that only registers itself (reader and class) is what the loader's `kinds.build` makes."""
    made = []

    @kinds.reader("test-identity")
    def read(cls, w, arch, hp, spec, rope):
        made.append((cls, spec.index, rope))
        return cls()

    @kinds.implements("test-identity", "torch")
    class Identity:
        pass

    try:
        spec = LayerSpec(3, 1e-6, AttentionSpec("test-identity"), FfnSpec("dense"))
        layer = kinds.build(spec, SimpleNamespace(impl=SimpleNamespace(name="torch")), None, None, "rope")
        assert isinstance(layer, Identity) and made == [(Identity, 3, "rope")]
        with pytest.raises(ValueError, match="no native implementation"):
            kinds.build(spec, SimpleNamespace(impl=SimpleNamespace(name="native")), None, None, "rope")
    finally:
        kinds._KINDS.pop("test-identity")


def test_build_takes_every_marked_header_into_the_cdef(tmp_path, monkeypatch):
    import build

    (tmp_path / "strata.h").write_text("/* the main header */\n")
    (tmp_path / "executor").mkdir()
    (tmp_path / "executor" / "newkind.h").write_text(f"/* A kind's step.\n *\n * {build.CDEF_MARK} (after strata.h). */\n")
    (tmp_path / "executor" / "internal.h").write_text("/* helpers, not for the cdef */\n")
    monkeypatch.setattr(build, "NATIVE", tmp_path)
    assert build.cdef_headers() == ("strata.h", "executor/newkind.h")
    # the real tree: the kinds' and the other entry points' headers, strata.h first
    monkeypatch.undo()
    assert build.HEADERS[0] == "strata.h" and "executor/deltanet.h" in build.HEADERS
    assert "executor/step.h" not in build.HEADERS
