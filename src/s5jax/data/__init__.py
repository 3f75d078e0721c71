"""Datasets: generators, readers of the original on-disk formats, and cached preparation.

This package uses numpy, Pillow and the standard library only; it never imports a model.
"""

from ._common import (
    DatasetError,
    atomic_dir,
    atomic_save_npy,
    atomic_save_npz,
    atomic_write_bytes,
    atomic_write_text,
    data_root,
)
from ._prepared import PreparedDataset, Split, load_prepared, save_prepared

__all__ = [
    "DatasetError",
    "PreparedDataset",
    "Split",
    "atomic_dir",
    "atomic_save_npy",
    "atomic_save_npz",
    "atomic_write_bytes",
    "atomic_write_text",
    "data_root",
    "load_prepared",
    "save_prepared",
]
