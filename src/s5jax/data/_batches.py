"""Mini-batches of a `Split`, deterministic and of one static shape.

The order of an epoch is a function of `(seed, epoch)` only, so a resumed run sees the same
batches; `skip` starts part-way through an epoch. With `pad_last=True` the final partial
batch is padded to `batch_size` (rows masked out with `mask == False`), so every batch has
the same shape and a jitted step compiles once. Rows are gathered in sorted index order and
then reordered, so memory-mapped splits are read batch by batch, never whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ._prepared import Split

__all__ = ["epoch_order", "iterate_batches", "num_batches"]

_FIELDS = ("x", "y", "lengths", "t")


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"batch_size must be an int, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")


def num_batches(n: int, batch_size: int, pad_last: bool = True, *, drop_last: bool = False) -> int:
    """The number of batches `iterate_batches` yields for `n` examples.

    `ceil(n / batch_size)`, whether the final partial batch is padded (`pad_last=True`) or
    yielded short (`pad_last=False`); `n // batch_size` with `drop_last=True`.
    """
    _check_batch_size(batch_size)
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    del pad_last  # the count is the same padded or short
    return n // batch_size if drop_last else -(-n // batch_size)


def epoch_order(n: int, *, shuffle: bool, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """The order in which epoch `epoch` visits examples `0 .. n-1`: a permutation, or `arange`.

    The permutation depends only on `(seed, epoch)` (a numpy `Generator` seeded with both).
    """
    if not shuffle:
        return np.arange(n)
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be non-negative, got seed={seed}, epoch={epoch}")
    rng = np.random.default_rng([int(seed), int(epoch)])
    return rng.permutation(n)


def _gather(arr: np.ndarray, idx: np.ndarray, contiguous: bool) -> np.ndarray:
    if contiguous:
        return np.array(arr[idx[0] : idx[-1] + 1])
    order = np.argsort(idx, kind="stable")
    rows = np.asarray(arr[idx[order]])  # sorted reads: sequential on a memory map
    out = np.empty_like(rows)
    out[order] = rows
    return out


def iterate_batches(
    split: Split,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int = 0,
    epoch: int = 0,
    pad_last: bool = True,
    drop_last: bool = False,
    skip: int = 0,
    rows: slice | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Yield the batches of one epoch of `split` as dicts of numpy arrays.

    Each batch has `x`, `y`, `mask` (bool (B,), False for padding rows) and, when the split
    has them, `lengths` and `t`. Every example appears exactly once per epoch among the rows
    with `mask` True (none is dropped unless `drop_last=True`).

    **Arguments:**
    - `split`: the data; its arrays may be memory maps (only each batch's rows are read).
    - `batch_size`: rows per batch.
    - `shuffle`: visit examples in a random order fixed by `(seed, epoch)` (see
      `epoch_order`), else in order.
    - `seed`, `epoch`: choose the order; the same pair gives the same batches.
    - `pad_last`: pad the final partial batch to `batch_size` by repeating its first row
      with `mask` False, so every batch has one static shape; if False it is yielded short.
    - `drop_last`: leave out the final partial batch instead (overrides `pad_last`).
    - `skip`: start at batch `skip` of the epoch (resume mid-epoch); the same as dropping
      the first `skip` batches.
    - `rows`: yield only these rows of each batch (padding and `mask` included), reading
      only them: one process's share of each global batch in multi-process training.
    """
    n = len(split)
    total = num_batches(n, batch_size, pad_last, drop_last=drop_last)
    if isinstance(skip, bool) or not isinstance(skip, (int, np.integer)) or skip < 0:
        raise ValueError(f"skip must be a non-negative int, got {skip!r}")
    if skip > total:
        raise ValueError(f"skip={skip} is past the end of the epoch ({total} batches)")
    order = epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    arrays = {name: getattr(split, name) for name in _FIELDS if getattr(split, name) is not None}
    if rows is not None and rows.indices(batch_size) == (0, batch_size, 1):
        rows = None  # every row (one process): the plain path, contiguous reads in order
    for b in range(skip, total):
        idx = order[b * batch_size : (b + 1) * batch_size]
        real = len(idx)
        pad = batch_size - real if pad_last else 0
        if rows is not None:
            # The batch's row indices, padding rows (copies of the first) included.
            mask = np.arange(real + pad) < real
            part = np.concatenate([idx, np.repeat(idx[:1], pad)])[rows]
            batch = {name: _gather(arr, part, False) for name, arr in arrays.items()}
            batch["mask"] = mask[rows]
            yield batch
            continue
        batch = {name: _gather(arr, idx, not shuffle) for name, arr in arrays.items()}
        if pad:
            batch = {
                name: np.concatenate([rows, np.repeat(rows[:1], pad, axis=0)])
                for name, rows in batch.items()
            }
        mask = np.zeros(real + pad, dtype=bool)
        mask[:real] = True
        batch["mask"] = mask
        yield batch
