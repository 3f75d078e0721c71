"""Shared plumbing for dataset preparation: errors, the data root, atomic writes.

Every dataset module prepares its data once into a cache folder and must never leave a
half-written file behind: writes go to a temporary name in the same folder and are renamed
into place only when complete.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from .._atomic import atomic_open, atomic_write_bytes, atomic_write_text

__all__ = [
    "DatasetError",
    "atomic_dir",
    "atomic_save_npy",
    "atomic_save_npz",
    "atomic_write_bytes",
    "atomic_write_text",
    "data_root",
    "read_generated",
    "set_progress_factory",
]

#: The file a generator writes next to the data it generates (`"generated": true`, the
#: generator, seed and parameters). Readers copy it into the prepared dataset's
#: `meta["generated"]`, so results trained on generated data are labelled as such.
GENERATED_FILE = "generator.json"

DATA_ROOT_ENV = "S5JAX_DATA"


#: Progress and notes of dataset preparation: logged, so the `s5jax` command's `-q`/`-v`
#: (and a library user's logging configuration) decide what is shown.
log = logging.getLogger("s5jax.data")

#: `(label, total) -> bar` with `update(n)` and `close()`, installed by the `s5jax` command
#: (a tqdm bar on a terminal); `None`: progress lines go to `log`. `data` itself stays free
#: of progress-bar libraries (numpy, Pillow and the standard library only).
_progress_factory: Callable[[str, int | None], object] | None = None


def set_progress_factory(factory: Callable[[str, int | None], object] | None):
    """Draw dataset-preparation progress with `factory(label, total)` (an object with
    `update(n)` and `close()`), or with log lines when `None`. Returns the previous one."""
    global _progress_factory
    previous, _progress_factory = _progress_factory, factory
    return previous


def progress_factory() -> Callable[[str, int | None], object] | None:
    """The factory installed by `set_progress_factory`, or `None`."""
    return _progress_factory


class DatasetError(ValueError):
    """A dataset is missing, malformed or inconsistent. The message names the file and the fix."""


#: How to point s5jax at a copy outside the data root, on each command (and in Python).
ELSEWHERE = (
    "A copy elsewhere: give its folder as `--source PATH` (`s5jax data prepare`), "
    "`--set data.root=PATH` (`s5jax train`) or `source=` (Python)."
)


def data_root() -> Path:
    """The folder under which datasets are looked for and cached.

    `$S5JAX_DATA` if set (and not empty), else `./data` relative to the current working
    directory. Raises `DatasetError` when that path is a file: every reader and generator would
    otherwise fail only when it writes its cache, after the work.
    """
    value = os.environ.get(DATA_ROOT_ENV) or ""
    root = Path(value or "data").expanduser()
    if root.exists() and not root.is_dir():
        where = f"${DATA_ROOT_ENV}={value}" if value else f"the default data root {root}"
        raise DatasetError(
            f"{where} is a file, not a folder; set ${DATA_ROOT_ENV} to the folder that holds "
            "(or will hold) the datasets"
        )
    return root


def atomic_save_npz(path: str | os.PathLike, *, compressed: bool = False, **arrays) -> None:
    """Save arrays to an `.npz` file atomically."""
    save = np.savez_compressed if compressed else np.savez
    with atomic_open(path) as f:
        save(f, **arrays)


def atomic_save_npy(path: str | os.PathLike, array: np.ndarray) -> None:
    """Save one array to an `.npy` file atomically (readable with `np.load(mmap_mode='r')`)."""
    with atomic_open(path) as f:
        np.save(f, array)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Build a whole folder under a temporary name; rename it to `path` only on success.

    An existing `path` is replaced. On any exception the temporary folder is removed and
    `path` is left as it was.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: its folders are 0700 whatever the umask, and the folder keeps its
    # mode after the rename (a dataset others could not read).
    while True:
        tmp = final.parent / f".{final.name}.{secrets.token_hex(6)}"
        try:
            tmp.mkdir()
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        if final.exists():
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_generated(folder: str | os.PathLike) -> dict | None:
    """The generator provenance in `folder` (its `generator.json`), or None for real data."""
    import json

    path = Path(folder) / GENERATED_FILE
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise DatasetError(f"{path} is unreadable ({error}); delete it or regenerate") from None
    return record if isinstance(record, dict) and record.get("generated") is True else None
