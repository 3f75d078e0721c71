"""LRA Pathfinder (32×32) and Path-X (128×128) from the user's copy of the LRA release.

Source: `lra_release.gz` extracted; the reader looks for `pathfinder{R}/` in the given folder
(default: the data root, as the other LRA readers), in its `lra_release/` or in its
`lra_release/lra_release/` (`datasets.md` §2.0, §2.2). Layout:

    pathfinder{R}/<difficulty>/metadata/<batch>.npy       plain text despite the extension
    pathfinder{R}/<difficulty>/imgs/<batch>/sample_<k>.png

As in S4/S5 (§2.2): only `curv_contour_length_14` (hard) is used by default; metadata files are
taken in the order of their integer stem and lines in file order; each line's fields [0] and [1]
give the image path `<difficulty>/<f0>/<f1>` and field [3] the label (0/1); the blacklisted empty
image `pathfinder32/curv_baseline/imgs/0/sample_172.png` is dropped. Each PNG is opened with
Pillow and `.convert("L")`, then ToTensor (/255) and Normalize(0.5, 0.5) in float32, so x lies in
[−1, 1], flattened row-major to (R², 1). The N listed images are split 80/10/10 with
`random_split([N − 2⌊0.1N⌋, ⌊0.1N⌋, ⌊0.1N⌋], seed 42)`. 2 classes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from ._common import DatasetError, read_generated
from ._prepared import PreparedDataset, Split
from .splits import random_split_indices, train_val_test_lengths
from .splits._build import (
    Scratch,
    default_out,
    missing_source,
    progress,
    resolve_source,
    reuse_prepared,
)

__all__ = ["BLACKLIST", "prepare_pathfinder", "read_pathfinder_metadata"]

ARCHIVE = "lra_release.gz"
DEFAULT_SOURCE = ""  # the data root itself, as the other LRA readers (ListOps, AAN)
DIFFICULTY = "curv_contour_length_14"
DIFFICULTIES = ("curv_baseline", "curv_contour_length_9", "curv_contour_length_14")
RESOLUTIONS = (32, 64, 128, 256)
BLACKLIST = frozenset({"pathfinder32/curv_baseline/imgs/0/sample_172.png"})
N_CLASSES = 2
_VERSION = 1


def _name(resolution: int, difficulty: str) -> str:
    base = {32: "pathfinder", 128: "pathx"}.get(resolution, f"pathfinder{resolution}")
    return base if difficulty == DIFFICULTY else f"{base}_{difficulty}"


#: The `s5jax data prepare` name that generates each resolution.
_GENERATE = {32: "pathfinder", 128: "pathx"}


def _locate(source: Path, resolution: int, difficulty: str) -> Path:
    folder = f"pathfinder{resolution}"
    candidates = [source / folder, source / "lra_release" / folder]
    candidates += [source / "lra_release" / "lra_release" / folder]
    if source.name == folder:
        candidates.insert(0, source)
    for candidate in candidates:
        if (candidate / difficulty / "metadata").is_dir():
            return candidate
    nested = Path("lra_release", "lra_release", folder, difficulty)
    raise DatasetError(
        missing_source(
            f"LRA {folder}/{difficulty}",
            source / nested / "metadata",
            f"Download the Long Range Arena archive {ARCHIVE} yourself and extract it into "
            f"{source}; its {folder}/ folder may sit directly in that folder, under lra_release/ "
            "or under lra_release/lra_release/."
            + (
                f" Or generate a synthetic copy with `s5jax data prepare {_GENERATE[resolution]} "
                "--generate` (not comparable with published numbers)."
                if resolution in _GENERATE
                else ""
            ),
            resolve_source(None, DEFAULT_SOURCE) / nested,
        )
    )


def _metadata_files(meta_dir: Path) -> list[Path]:
    files = list(meta_dir.glob("*.npy"))
    for path in files:
        if not path.stem.isdigit():
            raise DatasetError(f"{path}: metadata files must be named <integer>.npy")
    if not files:
        raise DatasetError(f"{meta_dir} holds no metadata files (<batch>.npy)")
    return sorted(files, key=lambda path: int(path.stem))


def read_pathfinder_metadata(
    root: str | os.PathLike, difficulty: str = DIFFICULTY
) -> list[tuple[Path, int]]:
    """(image path relative to `root`, label) for every listed, non-blacklisted image, in order.

    `root` is the `pathfinder{R}` folder.
    """
    root = Path(root)
    samples = []
    for path in _metadata_files(root / difficulty / "metadata"):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise DatasetError(
                f"{path} is not text metadata ({err}); the LRA release stores one line per image"
            ) from err
        for number, line in enumerate(text.splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise DatasetError(
                    f"{path}:{number}: expected '<subdir> <file> <index> <label 0/1> ...', "
                    f"got {line[:80]!r}"
                )
            relative = Path(difficulty) / fields[0] / fields[1]
            if f"{root.name}/{relative.as_posix()}" not in BLACKLIST:
                samples.append((relative, int(fields[3])))
    return samples


def _read_png(path: Path, resolution: int) -> np.ndarray:
    try:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L"), dtype=np.uint8)
    except FileNotFoundError:
        raise DatasetError(f"{path} is listed in the metadata but missing") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise DatasetError(f"{path} is not a readable image ({err})") from err
    if pixels.shape != (resolution, resolution):
        raise DatasetError(f"{path} is {pixels.shape[::-1]} px, expected {resolution}×{resolution}")
    return pixels


def _normalise(pixels: np.ndarray) -> np.ndarray:
    # ToTensor (/255) then Normalize(mean=0.5, std=0.5), in float32 arithmetic as torch
    half = np.float32(0.5)
    return (pixels.astype(np.float32) / np.float32(255) - half) / half


def prepare_pathfinder(
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    resolution: int = 32,
    *,
    difficulty: str = DIFFICULTY,
    force: bool = False,
) -> PreparedDataset:
    """Prepare LRA Pathfinder (`resolution=32`, L = 1024) or Path-X (`resolution=128`, L = 16384).

    **Arguments:**
    - `source`: folder holding `pathfinder{R}/` (directly, or under `lra_release/` or
      `lra_release/lra_release/`), or that folder itself (default `data_root()`).
    - `out`: output folder (default `data_root() / "prepared" / "pathfinder"` or `"pathx"`);
      reused when it was prepared from the same source with the same options, unless `force`.
    - `resolution`: 32, 64, 128 or 256.
    - `difficulty`: the S5 paper uses `curv_contour_length_14` only.

    **Returns:** the `PreparedDataset`: x (N, R², 1) float32 in [−1, 1]; 80/10/10 splits.
    """
    if resolution not in RESOLUTIONS:
        raise DatasetError(f"resolution must be one of {RESOLUTIONS}, got {resolution}")
    if difficulty not in DIFFICULTIES:
        raise DatasetError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    name = _name(resolution, difficulty)
    source = resolve_source(source, DEFAULT_SOURCE)
    out = default_out(out, name)
    options = {"version": _VERSION, "resolution": resolution, "difficulty": difficulty}
    options |= {"val_split": 0.1, "test_split": 0.1, "seed": 42}
    if not force and (ready := reuse_prepared(out, name, source, options)) is not None:
        return ready
    root = _locate(source, resolution, difficulty)
    samples = read_pathfinder_metadata(root, difficulty)
    lengths = train_val_test_lengths(len(samples))
    if min(lengths) == 0:
        raise DatasetError(
            f"{root / difficulty / 'metadata'} lists {len(samples)} images: too few for the "
            f"80/10/10 split (train/val/test {lengths})"
        )
    parts = random_split_indices(len(samples), lengths, seed=42)
    split_names = ("train", "val", "test")
    where = np.empty((len(samples), 2), np.int64)  # (split, row) of each listed image
    for s, indices in enumerate(parts):
        where[indices, 0] = s
        where[indices, 1] = np.arange(len(indices))
    labels = np.asarray([label for _, label in samples], np.int32)
    length = resolution * resolution

    with Scratch(out) as scratch:
        xs = [
            scratch.array(f"{n}_x", (len(p), length, 1), np.float32)
            for n, p in zip(split_names, parts, strict=True)
        ]
        step = max(len(samples) // 10, 1)
        for i, (relative, _) in enumerate(samples):
            if i % step == 0:
                progress(name, f"reading images {i}/{len(samples)} from {root}")
            pixels = _read_png(root / relative, resolution).reshape(length)
            s, row = where[i]
            xs[s][row, :, 0] = _normalise(pixels)
        splits = {
            n: Split(x=x, y=labels[p]) for n, x, p in zip(split_names, xs, parts, strict=True)
        }
        meta = {
            "source": str(source.resolve()),
            "root": str(root.resolve()),
            "options": options,
            "description": (
                f"LRA {_name(resolution, difficulty)}: {resolution}x{resolution} {difficulty}, "
                "pixels/255 normalised to [-1, 1]"
            ),
            "sizes": {k: len(v) for k, v in splits.items()},
        }
        if (generated := read_generated(root / difficulty)) is not None:
            meta["generated"] = generated
        dataset = PreparedDataset(name, "classification", splits, N_CLASSES, None, meta)
        progress(name, f"writing {out}")
        return scratch.finish(dataset)
