"""Atomic file writes: the one helper every layer uses to replace a file.

A file is written under a temporary name in its own folder, flushed and fsync'ed, renamed over
the target with `os.replace`, and the folder is fsync'ed so the rename itself survives a crash.
A reader sees the old file or the new one, never a half-written one; a failure while writing
leaves the old file untouched and no temporary file behind. New files get the mode a plain
`open` gives them, 0o666 & ~umask (0644 under the usual umask 022), not `mkstemp`'s 0600.

Standard library only, so that every layer (core, data, config, train) may import it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "atomic_open",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, mode: int = 0o666) -> Iterator[Path]:
    """A temporary sibling of `path` to write by any means; it becomes `path` on success.

    For writers that need a file name (a compiler, `savefig`). The file is created empty with
    `mode` & ~umask before the body runs; on an exception it is removed and `path` untouched.
    """
    final = Path(path)
    if final.is_dir():  # else os.replace fails late, naming the temporary file
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(final))
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_sibling(final, mode)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike, mode: str = "wb", *, encoding: str | None = None
) -> Iterator[IO[Any]]:
    """Open a temporary sibling of `path` for writing; it becomes `path` when the block ends.

    `mode` is "wb" (default) or "w" (text, UTF-8 unless `encoding` says otherwise). For
    writers that take a file object, e.g. `np.savez(f, ...)`.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    if mode == "w" and encoding is None:
        encoding = "utf-8"
    with atomic_path(path) as tmp, open(tmp, mode, encoding=encoding) as f:
        yield f  # closed here, then fsync'ed and renamed by atomic_path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` by `data`, atomically."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Replace `path` by `text` (UTF-8), atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, **dumps_options: Any) -> None:
    """Replace `path` by `obj` as JSON (indent 2 unless given, final newline), atomically."""
    dumps_options.setdefault("indent", 2)
    atomic_write_text(path, json.dumps(obj, **dumps_options) + "\n")


def _create_sibling(final: Path, mode: int) -> Path:
    while True:
        tmp = final.with_name(f".{final.name}.{secrets.token_hex(6)}.tmp")
        try:
            # os.open applies the umask to `mode`, as open() does; mkstemp would give 0600.
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
            return tmp
        except FileExistsError:
            continue


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform without directory handles (Windows): the rename is enough
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
