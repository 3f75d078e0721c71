"""Regenerate the shipped split permutations with torch itself (a maintainer's tool).

The package never imports torch: this script documents how the `randperm_*.npz` files in
`src/s5jax/data/splits/` were made, and the test suite reruns it (when torch is installed)
to check them. Run it in a throwaway environment, never in the package's own::

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
    /tmp/torchvenv/bin/python scripts/make_splits.py

It also writes `tests/torch_reference.npz`: small torch outputs the tests compare against
without torch (`write_test_reference`).

Each file holds one array `perm` = `torch.randperm(n, generator=torch.Generator().manual_seed(42))`,
stored as uint16. `random_split` cuts it into consecutive blocks.

| n | used by (`datasets.md`) | blocks |
|---|---|---|
| 50,000 | CIFAR-10 train → LRA Image, sCIFAR (§2.5, §4) | 45,000 train / 5,000 val |
| 60,000 | MNIST train → sMNIST, psMNIST (§4) | 54,000 train / 6,000 val |

Pathfinder / Path-X (§2.2) split N = the number of listed images (200,000 for the published
`curv_contour_length_14`; 160,000 / 20,000 / 20,000), which depends on the user's copy. No list
ships for it: `torch_randperm` (the exact port in `__init__.py`) computes it at prepare time, and
the tests pin its N = 200,000 output to a sha256 taken from torch (a 0.57 MB file saved).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

SIZES = (50_000, 60_000)
SEED = 42


def torch_permutation(n: int, seed: int = SEED) -> np.ndarray:
    """`torch.randperm(n)` from a generator seeded with `seed`, as int64 (needs torch)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=generator).numpy().astype(np.int64)


def main(folder: Path | None = None) -> None:
    default = Path(__file__).resolve().parents[1] / "src" / "s5jax" / "data" / "splits"
    folder = default if folder is None else folder
    for n in SIZES:
        perm = torch_permutation(n)
        path = folder / f"randperm_{n}_seed{SEED}.npz"
        np.savez_compressed(path, perm=perm.astype(np.uint16))
        print(f"wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)


#: (n, seed) of the small permutations the tests compare the numpy port against.
TEST_CASES = ((1, 42), (2, 42), (777, 42), (5000, 7))


def write_test_reference(path: Path | None = None) -> None:
    """torch's outputs that `tests/test_data_image_audio.py` checks without torch (16 KB).

    `perm_{n}_{seed}`: `torch.randperm(n)` for each of `TEST_CASES`; `cifar_gray`: ToTensor
    then Normalize(122.6/255, 61.0/255) of the 256 uint8 values in torch's float32 arithmetic.
    """
    import torch

    default = Path(__file__).resolve().parents[1] / "tests" / "torch_reference.npz"
    path = default if path is None else path
    arrays = {f"perm_{n}_{seed}": torch_permutation(n, seed) for n, seed in TEST_CASES}
    values = torch.arange(256, dtype=torch.uint8).float().div(255)
    normalised = values.sub_(torch.as_tensor(122.6 / 255)).div_(torch.as_tensor(61.0 / 255))
    arrays["cifar_gray"] = normalised.numpy()
    arrays["torch_version"] = np.asarray(torch.__version__)
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
    write_test_reference()
