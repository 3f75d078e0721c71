"""Train/val/test splits that match the reference code's `torch.randperm` draws, without torch.

A port, not a dependency: PyTorch is several GB for one shuffle, and the port is checked
against values torch produced (tests/torch_reference.npz).

The S4/S5 data modules split MNIST and CIFAR-10 (train → 90 % train / 10 % val) and Pathfinder
(80 / 10 / 10) with `torch.utils.data.random_split(...)` and the generator
`torch.Generator().manual_seed(42)`
(`datasets.md` §2.2, §2.5, §4, §5). `random_split` draws `torch.randperm(N, generator)` and cuts it
into consecutive blocks, each block in permutation order.

For the sizes used here, torch's CPU `randperm` is a Fisher–Yates-style shuffle: starting from
`r = arange(n)`, for `i = 0 .. n-2` it swaps `r[i]` with `r[i + (u_i mod (n - i))]`, where
`u_0, u_1, ...` are the raw 32-bit outputs of MT19937 seeded with `init_genrand(seed & 0xffffffff)`,
the same seeding as numpy's legacy `RandomState(seed)`. `torch_randperm` ports exactly that
(torch uses another algorithm only for n ≥ 2**32 / 20, far beyond any dataset here).

The permutations for the published dataset sizes were also computed once with torch itself
(`scripts/make_splits.py` in the repository) and ship as `randperm_{n}_seed{seed}.npz`;
`split_permutation` prefers them, and the tests check that the port reproduces them bit for bit.
"""

from __future__ import annotations

import itertools
from importlib import resources

import numpy as np

__all__ = [
    "random_split_indices",
    "shipped_permutation",
    "split_permutation",
    "torch_randperm",
    "train_val_lengths",
    "train_val_test_lengths",
]

_MAX_N = (2**32 - 1) // 20  # torch.randperm switches algorithm at this size


def torch_randperm(n: int, seed: int = 42) -> np.ndarray:
    """`torch.randperm(n, generator=torch.Generator().manual_seed(seed))` as an int64 array."""
    if not 0 <= n < _MAX_N:
        raise ValueError(f"n must be in [0, {_MAX_N}), got {n}")
    bits = np.random.MT19937()
    bits.state = np.random.RandomState(seed & 0xFFFFFFFF).get_state(legacy=False)
    draws = bits.random_raw(max(n - 1, 0)).astype(np.int64)
    offsets = draws % (n - np.arange(n - 1, dtype=np.int64))
    perm = list(range(n))
    for i, z in enumerate(offsets.tolist()):
        j = i + z
        perm[i], perm[j] = perm[j], perm[i]
    return np.asarray(perm, dtype=np.int64)


def _shipped_name(n: int, seed: int) -> str:
    return f"randperm_{n}_seed{seed}.npz"


def shipped_permutation(n: int, seed: int = 42) -> np.ndarray | None:
    """The torch-made permutation shipped for size `n` and `seed`, or `None` if none ships."""
    resource = resources.files(__name__).joinpath(_shipped_name(n, seed))
    if not resource.is_file():
        return None
    with resource.open("rb") as f, np.load(f) as archive:
        perm = archive["perm"].astype(np.int64)
    if perm.shape != (n,):
        raise ValueError(f"shipped split {resource} has shape {perm.shape}, expected ({n},)")
    return perm


def split_permutation(n: int, seed: int = 42) -> np.ndarray:
    """The permutation `random_split` draws for a dataset of size `n` (shipped or ported)."""
    perm = shipped_permutation(n, seed)
    return torch_randperm(n, seed) if perm is None else perm


def random_split_indices(n: int, lengths: list[int], seed: int = 42) -> list[np.ndarray]:
    """Indices of each part of `torch.utils.data.random_split(range(n), lengths, generator)`.

    Each part lists dataset indices in the order `random_split` yields them.
    """
    if sum(lengths) != n or min(lengths, default=0) < 0:
        raise ValueError(f"lengths {lengths} must be non-negative and sum to {n}")
    perm = split_permutation(n, seed)
    bounds = np.cumsum([0, *lengths])
    return [perm[a:b] for a, b in itertools.pairwise(bounds)]


def train_val_lengths(n: int, val_split: float = 0.1) -> list[int]:
    """Lengths of S4/S5 `split_train_val(val_split)`: `train = int(n * (1 - val_split))`."""
    train = int(n * (1.0 - val_split))
    return [train, n - train]


def train_val_test_lengths(n: int, val_split: float = 0.1, test_split: float = 0.1) -> list[int]:
    """Lengths of the S4/S5 Pathfinder split: `val = int(val_split * n)`, likewise test."""
    val = int(val_split * n)
    test = int(test_split * n)
    return [n - val - test, val, test]
