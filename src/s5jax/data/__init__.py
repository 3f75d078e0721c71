"""Datasets: generators, readers of the original on-disk formats, and cached preparation.

This package uses numpy, Pillow and the standard library only; it never imports a model.
Every `prepare_*` reads a user's local copy (or generates the data), writes a cached folder
atomically (see `PreparedDataset`) and returns it memory-mapped. Nothing is downloaded.
"""

from ._aan import prepare_retrieval
from ._batches import epoch_order, iterate_batches, num_batches
from ._cifar import prepare_image, prepare_scifar
from ._common import (
    DatasetError,
    atomic_dir,
    atomic_save_npy,
    atomic_save_npz,
    atomic_write_bytes,
    atomic_write_text,
    data_root,
    set_progress_factory,
)
from ._imdb import prepare_text
from ._listops import (
    evaluate_listops,
    generate_listops,
    generate_listops_examples,
    listops_tokenize,
    prepare_listops,
)
from ._mnist import bitreversal_permutation, prepare_psmnist, prepare_smnist
from ._npz import describe, load_user_npz
from ._pathfinder import prepare_pathfinder
from ._pathfinder_gen import generate_pathfinder
from ._pendulum import (
    PENDULUM_FILENAME,
    generate_pendulum_npz,
    load_pendulum_npz,
    observation_intervals,
    prepare_pendulum,
    subsample_indices,
)
from ._prepared import PreparedDataset, Split, load_prepared, save_prepared
from ._speech import CLASSES as SPEECH_CLASSES
from ._speech import prepare_speech_commands
from .splits import torch_randperm

__all__ = [
    "PENDULUM_FILENAME",
    "SPEECH_CLASSES",
    "DatasetError",
    "PreparedDataset",
    "Split",
    "atomic_dir",
    "atomic_save_npy",
    "atomic_save_npz",
    "atomic_write_bytes",
    "atomic_write_text",
    "bitreversal_permutation",
    "data_root",
    "describe",
    "epoch_order",
    "evaluate_listops",
    "generate_listops",
    "generate_listops_examples",
    "generate_pathfinder",
    "generate_pendulum_npz",
    "iterate_batches",
    "listops_tokenize",
    "load_pendulum_npz",
    "load_prepared",
    "load_user_npz",
    "num_batches",
    "observation_intervals",
    "prepare_image",
    "prepare_listops",
    "prepare_pathfinder",
    "prepare_pendulum",
    "prepare_psmnist",
    "prepare_retrieval",
    "prepare_scifar",
    "prepare_smnist",
    "prepare_speech_commands",
    "prepare_text",
    "save_prepared",
    "set_progress_factory",
    "subsample_indices",
    "torch_randperm",
]
