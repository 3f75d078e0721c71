"""Plumbing shared by the readers of users' local copies (CIFAR-10, MNIST, Pathfinder, Speech).

- `reuse_prepared`: the idempotency rule. An output folder is reused when its meta records the
  same dataset name, source path and options.
- `Scratch`: large splits are written example by example into memory-mapped `.npy` files in a
  hidden sibling of the output folder, so that no dataset needs to fit in memory; the scratch
  folder is removed whatever happens, and the output appears only through `save_prepared`'s
  atomic rename.
- `missing_source`: the one wording of "this dataset is not there: download X, put it at Y".
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .._common import ELSEWHERE, DatasetError, data_root
from .._prepared import PreparedDataset, load_prepared, save_prepared

__all__ = [
    "Scratch",
    "default_out",
    "missing_source",
    "progress",
    "resolve_source",
    "reuse_prepared",
]


def progress(name: str, message: str) -> None:
    """One progress line on stderr."""
    print(f"[s5jax.data] {name}: {message}", file=sys.stderr, flush=True)


def resolve_source(source: str | os.PathLike | None, default: str) -> Path:
    """`source` as a path, or `data_root() / default` when it is `None`."""
    return Path(source).expanduser() if source is not None else data_root() / default


def default_out(out: str | os.PathLike | None, name: str) -> Path:
    """`out` as a path, or `data_root() / "prepared" / name` when it is `None`."""
    return Path(out).expanduser() if out is not None else data_root() / "prepared" / name


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def reuse_prepared(
    out: Path, name: str, source: Path, options: dict[str, Any]
) -> PreparedDataset | None:
    """The dataset already prepared in `out` from the same source and options, else `None`."""
    meta_path = out / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        info = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None
    recorded = info.get("meta", {})
    if (
        info.get("name") != name
        or recorded.get("source") != str(source.resolve())
        or recorded.get("options") != _jsonable(options)
    ):
        return None
    try:
        return load_prepared(out)
    except DatasetError:
        return None


def missing_source(what: str, expected: Path, instruction: str, default: Path) -> str:
    """The message for a dataset that is not where it should be.

    `instruction` names what to download (an archive name, never a URL: s5jax never fetches data)
    and how to unpack it.
    """
    return (
        f"{what} not found: expected {expected}. {instruction} The default location is {default} "
        f"(the data root is {data_root()}; set $S5JAX_DATA to move it). {ELSEWHERE}"
    )


class Scratch:
    """A hidden scratch folder beside `out` holding memory-mapped arrays while a dataset is built.

    Use as a context manager; `finish` saves the dataset atomically to `out` and returns it
    memory-mapped from there. The scratch folder is deleted on exit, success or not.
    """

    def __init__(self, out: Path):
        self.out = out
        self.folder: Path | None = None

    def __enter__(self) -> Scratch:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.build-", dir=self.out.parent))
        return self

    def __exit__(self, *exc) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def array(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A zero-filled array of `shape` backed by a file in the scratch folder."""
        if self.folder is None:
            raise RuntimeError("Scratch.array used outside its `with` block")
        if int(np.prod(shape)) == 0:
            return np.zeros(shape, dtype)
        return np.lib.format.open_memmap(self.folder / f"{name}.npy", "w+", dtype, shape)

    def finish(self, dataset: PreparedDataset) -> PreparedDataset:
        """Write `dataset` to `out` (atomic) and return it loaded from there."""
        save_prepared(self.out, dataset)
        return load_prepared(self.out)
