"""Models named by their Hugging Face hub repository, as llama.cpp's `-hf user/repo[:quant]`.

    resolve("user/repo:Q4_K_M")  ->  .../models--user--repo/snapshots/<commit>/Model-Q4_K_M.gguf

The repository's files are listed (online: the hub's listing; offline, HF_HUB_OFFLINE=1 or the hub
unreachable: the cached snapshot of its main revision, as llama.cpp does), the GGUF of the quant is
picked by llama.cpp's rule (`pick`), and it is fetched, with every part of a split model, through
huggingface_hub's `hf_hub_download`: its progress bars, resumed downloads, cache (HF_HOME,
HF_HUB_CACHE) and token (HF_TOKEN). The local path of the first part opens as any model path does
(a split model opens from any part: `strata.gguf.split`).
Must not print (huggingface_hub's progress bars aside) or open the model.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from strata.errors import StrataArgumentError, StrataError

#: The quants llama.cpp tries, in order, when the spec names none; then the first model file.
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
#: Files beside a model that are not one (llama.cpp's gguf_filename_is_model).
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
SPEC_FORM = "USER/REPO[:QUANT]"

_NAME_PART = r"[A-Za-z0-9_]+(?:[-.][A-Za-z0-9_]+)*"  # llama.cpp's is_valid_repo_id: no leading, trailing or doubled - .
_SPEC = re.compile(rf"({_NAME_PART}/{_NAME_PART})(?::([A-Za-z0-9_.-]*))?")
_SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubFiles:
    """A model fetched from a hub repository: its files there (the first part first) and their
    local paths in the hub's cache."""

    repo_id: str
    files: tuple[str, ...]
    paths: tuple[Path, ...]

    @property
    def path(self) -> Path:
        """The path to open: the model's file, or the first part of a split model."""
        return self.paths[0]


def parse_spec(spec: str) -> tuple[str, str | None]:
    """(repo_id, quant or None) of "user/repo[:quant]"; anything else is a one-line error."""
    m = _SPEC.fullmatch(spec.strip()) if isinstance(spec, str) else None
    if m is None:
        raise StrataArgumentError(f"-hf {spec!r}: expected {SPEC_FORM}, e.g. unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M")
    return m.group(1), m.group(2) or None


def split_info(path: str) -> tuple[str, str, int, int]:
    """(prefix, quant tag, part number from 1, part count) of a .gguf file's repository path, as
    llama.cpp reads it: Q4_K_M/Model-Q4_K_M-00002-of-00003.gguf -> ("Q4_K_M/Model-Q4_K_M", "Q4_K_M", 2, 3)."""
    prefix = path[:-len(".gguf")]
    index = count = 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    tag = _TAG.search(prefix)
    return prefix, tag.group(1).upper() if tag else "", index, count


def is_model(path: str) -> bool:
    """A .gguf file that is a model, not a projector, an imatrix or a draft head."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(word in name for word in NOT_MODELS)


def quants(files: Sequence[str]) -> list[str]:
    """The quant tags of the repository's models (each model once, in listing order)."""
    tags = [split_info(f)[1] for f in files if is_model(f) and split_info(f)[2] == 1]
    return list(dict.fromkeys(t for t in tags if t))


def pick(files: Sequence[str], quant: str | None, repo_id: str = "the repository") -> list[str]:
    """The repository files that make the model of `quant` (every part of a split one, in order).

    llama.cpp's rule: the first model file (first part) whose path holds the tag followed by '-' or
    '.', case-insensitive (Q4_K matches Model-Q4_K.gguf, not Model-Q4_K_M.gguf); without a quant,
    Q4_K_M, then Q8_0, then the first model file."""
    models = [f for f in files if is_model(f) and split_info(f)[2] == 1]
    if not models:
        raise StrataError(f"{repo_id} has no GGUF model file")
    for tag in (quant,) if quant else DEFAULT_QUANTS:
        pattern = re.compile(re.escape(tag) + "[.-]", re.IGNORECASE)
        first = next((f for f in models if pattern.search(f)), None)
        if first is not None:
            return _parts(first, files, repo_id)
    if quant:
        present = ", ".join(quants(files)) or "no file named by its quant"
        raise StrataError(f"{repo_id} has no {quant} file; it has: {present}")
    return _parts(models[0], files, repo_id)


def _parts(first: str, files: Sequence[str], repo_id: str) -> list[str]:
    prefix, _, _, count = split_info(first)
    if count == 1:
        return [first]
    parts = [f"{prefix}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]  # gguf-split's names
    present = set(files)
    missing = next((i for i, p in enumerate(parts) if p not in present), None)
    if missing is not None:
        raise StrataError(f"{repo_id}: {parts[missing]} is missing (part {missing + 1} of {count} of {first})")
    return parts


def cached_files(repo_id: str, cache_dir: str | os.PathLike | None = None, revision: str = "main") -> list[str]:
    """The files of the cached snapshot of `repo_id` at `revision` (refs/<revision> in the hub's cache
    layout), as repository paths; [] when none is cached."""
    from huggingface_hub import constants

    repo = Path(cache_dir or constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    try:
        commit = (repo / "refs" / revision).read_text().strip()
    except OSError:
        return []
    snapshot = repo / "snapshots" / commit
    if not _COMMIT.fullmatch(commit) or not snapshot.is_dir():
        return []
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file() or p.is_symlink())


def list_files(repo_id: str, *, cache_dir: str | os.PathLike | None = None, offline: bool | None = None) -> list[str]:
    """The repository's files: the hub's listing, or offline (or when the hub cannot be reached)
    the cached snapshot's."""
    return _list(repo_id, cache_dir, offline)[0]


def _list(repo_id: str, cache_dir, offline: bool | None) -> tuple[list[str], bool]:
    """(files, whether they come from the cache)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    why = "HF_HUB_OFFLINE is set"
    if not (constants.HF_HUB_OFFLINE if offline is None else offline):
        try:
            # model_info: one request (list_repo_files retries for half a minute when the hub is unreachable)
            return [s.rfilename for s in HfApi().model_info(repo_id).siblings or ()], False
        except GatedRepoError:
            raise StrataError(f"{repo_id}: a gated repository: accept its terms on the hub and set HF_TOKEN") from None
        except RepositoryNotFoundError:
            raise StrataError(f"{repo_id}: no such repository on the hub (a private one needs HF_TOKEN)") from None
        except Exception as e:  # the network or the hub is down: llama.cpp falls back to the cache too
            why = f"the hub cannot be reached ({_one_line(e)})"
    files = cached_files(repo_id, cache_dir)
    if not files:
        raise StrataError(f"{repo_id}: not in the cache ({cache_dir or constants.HF_HUB_CACHE}) and {why}")
    return files, True


def fetch(spec: str, *, cache_dir: str | os.PathLike | None = None, offline: bool | None = None) -> HubFiles:
    """The model of `spec` ("user/repo[:quant]"), every part of it downloaded into the hub's cache
    (or found there). cache_dir: the hub cache (default HF_HUB_CACHE, or HF_HOME/hub); offline:
    use only the cache (default: HF_HUB_OFFLINE). Errors are one-line StrataErrors."""
    from huggingface_hub import hf_hub_download

    repo_id, quant = parse_spec(spec)
    listing, cached = _list(repo_id, cache_dir, offline)
    files = pick(listing, quant, repo_id)
    paths = []
    for name in files:
        try:
            paths.append(Path(hf_hub_download(repo_id, name, cache_dir=cache_dir, local_files_only=cached)))
        except Exception as e:  # hub, network and disk errors alike: one line naming the file
            where = "not in the cache" if cached else f"cannot download it: {_one_line(e)}"
            raise StrataError(f"{repo_id}: {name}: {where}") from None
    return HubFiles(repo_id, tuple(files), tuple(paths))


def resolve(spec: str, *, cache_dir: str | os.PathLike | None = None, offline: bool | None = None) -> Path:
    """The local path of the model of `spec` ("user/repo[:quant]"), fetched as `fetch` does, for
    `strata.load`: `strata.load(strata.hub.resolve("user/repo:Q4_K_M"))`."""
    return fetch(spec, cache_dir=cache_dir, offline=offline).path


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


__all__ = ["DEFAULT_QUANTS", "HubFiles", "cached_files", "fetch", "is_model", "list_files", "parse_spec", "pick",
           "quants", "resolve", "split_info"]
