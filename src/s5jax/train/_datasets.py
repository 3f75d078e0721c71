"""From a config's `data.dataset` name to a `PreparedDataset`.

Paper datasets are prepared by `s5jax.data` from the user's local copy (or generated, for the
pendulum); a missing copy raises a `DatasetError` saying what to download and where to put it.
`synthetic` is generated in memory for smoke tests. A path ending in `.npz` is a user's own
data in the documented format; a path ending in `.ts` is a UEA/UCR `NAME_TRAIN.ts` (with
`NAME_TEST.ts` beside it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .. import data as s5data
from ..data import PreparedDataset, Split

__all__ = [
    "DATASETS",
    "PREPARED_FOLDERS",
    "limit_and_check",
    "load_dataset",
    "load_user_data",
    "prepare_named",
    "synthetic_dataset",
]


def synthetic_dataset(
    *, seq_len: int = 32, n_train: int = 64, n_eval: int = 32, n_classes: int = 4, seed: int = 0
) -> PreparedDataset:
    """A small long-range classification task: the class is written only in the first steps.

    Each sequence is Gaussian noise (L, 1); its first min(8, L) steps hold one of `n_classes`
    fixed ±1 patterns. Deterministic in `seed`.
    """
    rng = np.random.default_rng(seed)
    marker = min(8, seq_len)
    patterns = rng.choice([-1.0, 1.0], size=(n_classes, marker))

    def split(n):
        y = rng.integers(0, n_classes, n).astype(np.int32)
        x = (0.5 * rng.standard_normal((n, seq_len, 1))).astype(np.float32)
        x[:, :marker, 0] = patterns[y]
        return Split(x=x, y=y)

    return PreparedDataset(
        name="synthetic",
        task="classification",
        splits={"train": split(n_train), "val": split(n_eval), "test": split(n_eval)},
        n_classes=n_classes,
        meta={"description": "class written in the first steps of noise", "seed": seed},
    )


def _prepare(
    fn: Callable, prepared: str | None = None, options: Callable | None = None, **kwargs
) -> Callable:
    """A loader that calls `fn` (a `prepare_*` reader) with the config's `data.root`.

    Without `data.root`, a dataset already prepared under `<data root>/prepared/<prepared>`
    is used as it is, whatever source it was prepared from (`s5jax data prepare NAME
    --source PATH` or `--generate`): the cache records its source and the run prints it.
    `options(data_cfg)` gives further keyword arguments of `fn` taken from the config.
    """

    def load(data_cfg):
        args = kwargs if options is None else {**kwargs, **options(data_cfg)}
        if data_cfg.root:
            return fn(data_cfg.root, **args)
        if prepared is not None:
            folder = s5data.data_root() / "prepared" / prepared
            if (folder / "meta.json").is_file():
                try:
                    return s5data.load_prepared(folder)
                except s5data.DatasetError:
                    pass  # damaged or half-written cache: prepare again below
        return fn(**args)

    return load


def _listops_options(data_cfg) -> dict:
    """ListOps is prepared at the configured `data.seq_len` (l_max; 2048 in the paper)."""
    seq_len = getattr(data_cfg, "seq_len", None)
    return {} if seq_len is None else {"l_max": int(seq_len)}


DATASETS: dict[str, Callable] = {
    "synthetic": lambda cfg: synthetic_dataset(
        seq_len=cfg.seq_len or 32, n_train=cfg.n_train or 64, n_eval=cfg.n_eval or 32
    ),
    "pendulum": _prepare(s5data.prepare_pendulum),
    "listops": _prepare(s5data.prepare_listops, "listops", _listops_options),
    "text": _prepare(s5data.prepare_text, "text"),
    "retrieval": _prepare(s5data.prepare_retrieval, "retrieval"),
    "image": _prepare(s5data.prepare_image, "image"),
    "scifar": _prepare(s5data.prepare_scifar, "scifar"),
    "smnist": _prepare(s5data.prepare_smnist, "smnist"),
    "psmnist": _prepare(s5data.prepare_psmnist, "psmnist"),
    "pathfinder": _prepare(s5data.prepare_pathfinder, "pathfinder", resolution=32),
    "pathx": _prepare(s5data.prepare_pathfinder, "pathx", resolution=128),
    "speech35": _prepare(s5data.prepare_speech_commands, "speech35"),
}

#: The folder under `<data root>/prepared/` of each dataset read from disk.
PREPARED_FOLDERS = {name: name for name in DATASETS if name not in ("synthetic", "pendulum")}


def is_user_file(name: str) -> bool:
    """Whether `data.dataset` names a user's file (`.npz`, or a UEA/UCR `.ts`)."""
    return name.endswith(".npz") or name.lower().endswith(".ts")


def load_user_data(path, data_cfg=None, *, announce: bool = True) -> PreparedDataset:
    """A user's own data file: an `.npz` in the documented format, or a UEA/UCR
    `NAME_TRAIN.ts` (read with `NAME_TEST.ts` beside it, with `data_cfg`'s `missing`);
    either's val split, when the file has none, is carved with `data_cfg`'s `val_fraction`
    and `val_seed` (defaults without `data_cfg`; `announce` logs how the val split was made,
    `announce_val_split`)."""
    from ..data._uea import announce_val_split

    carve = {}
    if data_cfg is not None:
        carve = {"val_fraction": data_cfg.val_fraction, "val_seed": data_cfg.val_seed}
    if str(path).lower().endswith(".ts"):
        from ..data._uea import load_ts

        missing = {} if data_cfg is None else {"missing": data_cfg.missing}
        return load_ts(Path(path), **missing, **carve, announce=announce)
    from ..data._npz import load_user_npz

    dataset = load_user_npz(Path(path), **carve)
    if announce:
        announce_val_split(dataset)
    return dataset


def load_dataset(data_cfg, *, announce: bool = True) -> PreparedDataset:
    """The dataset named by `data_cfg.dataset` (a registered name, or a path to a `.npz` or
    to a UEA/UCR `NAME_TRAIN.ts`), its float inputs normalised as `data_cfg.normalize` says
    (statistics from its train split; `s5jax.data._normalize`), with `meta["digest"]` of the
    examples as read (`s5jax.data._prepared.data_digest`). `announce`: log how a user
    file's val split was made (training says it; eval and predict of a run do not repeat it)."""
    from ..data._normalize import normalize_dataset
    from ..data._prepared import with_digest

    name = data_cfg.dataset
    if is_user_file(name):
        dataset = load_user_data(name, data_cfg, announce=announce)
        return normalize_dataset(
            with_digest(dataset), data_cfg.normalize, data_cfg.normalize_targets
        )
    if name not in DATASETS:
        raise ValueError(
            f"data.dataset = {name!r}: {_close(name, sorted(DATASETS))}known datasets: "
            f"{', '.join(sorted(DATASETS))}; or a path to a .npz file or a NAME_TRAIN.ts file"
        )
    dataset = DATASETS[name](data_cfg)
    if name != "synthetic":  # synthetic is made to the requested sizes already
        dataset = limit_and_check(dataset, data_cfg)
    return normalize_dataset(with_digest(dataset), data_cfg.normalize, data_cfg.normalize_targets)


def sequence_length(split: Split) -> int:
    """Steps per example: token ids are (N, L) or (N, 2, L) pairs; features (N, L, d)."""
    x = split.x
    return int(x.shape[-1] if np.issubdtype(x.dtype, np.integer) else x.shape[1])


def limit_and_check(dataset: PreparedDataset, data_cfg) -> PreparedDataset:
    """Apply `data.n_train` / `data.n_eval` (keep the first examples of each split) and check
    `data.seq_len` against the train, val and test splits."""
    import dataclasses

    if data_cfg.seq_len is not None:
        for split_name in ("train", "val", "test"):
            if split_name not in dataset.splits:
                continue
            length = sequence_length(dataset.splits[split_name])
            if length != data_cfg.seq_len:
                raise s5data.DatasetError(
                    f"data.seq_len = {data_cfg.seq_len} but the {split_name} split of "
                    f"{dataset.name!r} has sequences of length {length} (source: "
                    f"{dataset.meta.get('source', 'unknown')}); train at that length with "
                    f"--set data.seq_len={length}, or prepare the dataset again at "
                    f"{data_cfg.seq_len} (the paper's options)"
                )
    limits = {"train": data_cfg.n_train}
    limits |= {s: data_cfg.n_eval for s in dataset.splits if s != "train"}
    if all(v is None for v in limits.values()):
        return dataset

    def head(split: Split, n: int | None) -> Split:
        if n is None or n >= len(split):
            return split
        return Split(**{
            f.name: None if getattr(split, f.name) is None else getattr(split, f.name)[:n]
            for f in dataclasses.fields(split)
        })  # fmt: skip

    splits = {s: head(split, limits.get(s)) for s, split in dataset.splits.items()}
    meta = {**dataset.meta, "limited": {s: len(v) for s, v in splits.items()}}
    return dataclasses.replace(dataset, splits=splits, meta=meta)


def _close(name: str, names: list[str]) -> str:
    """ "did you mean ...? " for a mistyped or shortened name (`mnist`, `cifar`), else ""."""
    from ..config._types import did_you_mean

    return did_you_mean(name, names, substrings=True)


def prepare_named(name: str, source=None) -> PreparedDataset:
    """Prepare the registered dataset `name` from `source` (default: under the data root)."""
    if name == "synthetic":
        raise ValueError("synthetic is generated in memory when a run starts; nothing to prepare")
    if name not in DATASETS:
        names = sorted([*(n for n in DATASETS if n != "synthetic"), "uea"])
        raise ValueError(
            f"unknown dataset {name!r}: {_close(name, names)}known datasets: {', '.join(names)}"
        )

    class _Cfg:
        root = None if source is None else str(source)

    return DATASETS[name](_Cfg)
