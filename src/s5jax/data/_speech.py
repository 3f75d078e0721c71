"""Speech Commands v0.02, 35 classes (SC35), with the 8 kHz zero-shot val/test sets.

Read with the standard library's `wave`, not an audio library: the files are plain 16-bit PCM,
and torchaudio or soundfile would add a native dependency for what `wave` does exactly.

Source: the user's copy of `speech_commands_v0.02.tar.gz`, extracted: 35 class folders of 16 kHz
mono 16-bit `.wav` files plus `validation_list.txt` and `testing_list.txt` (`datasets.md` §3),
found in the given folder, its `SpeechCommands/` (S5's layout) or its `speech_commands_v0.02/`.
Files are read with the standard library's `wave` module.

As S4/S5 `_SpeechCommands._process_all` (§3):
- label = index of the folder in the fixed (not alphabetical) `CLASSES` list;
- samples scaled to int16 / 2**30 (torchaudio's /2**15, then the code's own extra /2**15), zero
  padded at the end to 16,000; a longer clip is an error (the real data has none);
- `"<folder>/<file>"` in `validation_list.txt` → val, else in `testing_list.txt` → test, else train;
- per-time-step standardisation with train statistics: for each t, x[:, t] ← (x[:, t] − m_t) /
  (s_t + 1e-5), m_t the mean and s_t the unbiased (N − 1) std over the train clips. Because of the
  extra /2**15, s_t ~ 1e-6 and the 1e-5 dominates, as in the reference. The statistics are computed
  exactly (integer sums) and rounded to float32; torch's float32 reduction may differ by an ulp.
- x (N, 16000, 1) float32; `val_8khz`/`test_8khz` keep samples 0, 2, 4, … of the normalised val
  and test clips (no filtering), x (N, 8000, 1), to be evaluated with step_rescale = 2.

Files within a class folder are taken in sorted order (the reference's `os.listdir` order depends
on the filesystem); only the order of examples inside a split depends on it.
"""

from __future__ import annotations

import os
import wave
from pathlib import Path

import numpy as np

from ._common import DatasetError
from ._prepared import PreparedDataset, Split
from .splits._build import (
    Scratch,
    default_out,
    missing_source,
    progress,
    resolve_source,
    reuse_prepared,
)

__all__ = ["CLASSES", "prepare_speech_commands", "read_wav"]

CLASSES = (
    "bed", "cat", "down", "five", "forward", "go", "house", "left", "marvin", "no", "on",
    "right", "sheila", "tree", "up", "visual", "yes", "backward", "bird", "dog", "eight",
    "follow", "four", "happy", "learn", "nine", "off", "one", "seven", "six", "stop", "three",
    "two", "wow", "zero",
)  # fmt: skip
ARCHIVE = "speech_commands_v0.02.tar.gz"
DEFAULT_SOURCE = "speech_commands"
VAL_LIST = "validation_list.txt"
TEST_LIST = "testing_list.txt"
SAMPLE_RATE = 16_000
LENGTH = 16_000
SCALE = 2.0**-30  # torchaudio's int16 / 2**15, then the reference's extra / 2**15
EPS = 1e-5
_CHUNK = 1024
_VERSION = 1


def read_wav(path: str | os.PathLike) -> np.ndarray:
    """The int16 samples of a 16 kHz mono 16-bit PCM wav file."""
    path = Path(path)
    try:
        with wave.open(str(path), "rb") as f:
            rate, channels, width = f.getframerate(), f.getnchannels(), f.getsampwidth()
            frames = f.readframes(f.getnframes())
    except (wave.Error, EOFError, OSError) as err:
        raise DatasetError(f"{path} is not a readable PCM wav file ({err})") from err
    if (rate, channels, width) != (SAMPLE_RATE, 1, 2):
        raise DatasetError(
            f"{path}: {rate} Hz, {channels} channel(s), {8 * width}-bit; Speech Commands v0.02 "
            f"files are {SAMPLE_RATE} Hz mono 16-bit"
        )
    if len(frames) % 2:
        raise DatasetError(f"{path}: truncated sample data")
    return np.frombuffer(frames, "<i2")


def _locate(source: Path) -> Path:
    for root in (
        source,
        source / "SpeechCommands",
        source / "speech_commands_v0.02",
        source / "0.0.2" / "SpeechCommands",
    ):
        if (root / VAL_LIST).is_file():
            return root
    raise DatasetError(
        missing_source(
            "Speech Commands v0.02",
            source / VAL_LIST,
            f"Download the archive {ARCHIVE} yourself and extract it into {source}; it unpacks "
            f"the 35 word folders, {VAL_LIST} and {TEST_LIST} side by side (a SpeechCommands/ "
            "or speech_commands_v0.02/ subfolder is searched too).",
            resolve_source(None, DEFAULT_SOURCE),
        )
    )


def _read_list(path: Path) -> set[str]:
    try:
        return {line.rstrip() for line in path.read_text().splitlines() if line.strip()}
    except OSError as err:
        raise DatasetError(f"{path} could not be read ({err})") from err


def _assign(root: Path) -> dict[str, list[tuple[Path, int]]]:
    """(wav path, label) of every clip, by split, in class order then file-name order."""
    missing = [word for word in CLASSES if not (root / word).is_dir()]
    if missing:
        raise DatasetError(
            f"{root} lacks the class folder(s) {', '.join(missing)}: SC35 needs the 35 words of "
            f"Speech Commands v0.02 ({ARCHIVE})"
        )
    val, test = _read_list(root / VAL_LIST), _read_list(root / TEST_LIST)
    splits: dict[str, list[tuple[Path, int]]] = {"train": [], "val": [], "test": []}
    for label, word in enumerate(CLASSES):
        for name in sorted(os.listdir(root / word)):
            if not name.endswith(".wav"):
                continue
            key = f"{word}/{name}"
            split = "val" if key in val else "test" if key in test else "train"
            splits[split].append((root / word / name, label))
    for split, listing in (("val", VAL_LIST), ("test", TEST_LIST)):
        if not splits[split]:
            raise DatasetError(
                f"{root / listing} names no wav file present under {root}: the {split} split "
                "would be empty"
            )
    if len(splits["train"]) < 2:
        raise DatasetError(
            f"{root}: {len(splits['train'])} training clip(s) (files in neither list); the "
            "per-time-step standard deviation needs at least 2"
        )
    return splits


def _train_statistics(train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float32 per-time-step mean and unbiased std of train clips (int16 samples · 2**-30)."""
    n = len(train)
    total = np.zeros(LENGTH, np.int64)
    squares = np.zeros(LENGTH, np.int64)
    for start in range(0, n, _CHUNK):
        chunk = train[start : start + _CHUNK].astype(np.int64)
        total += chunk.sum(axis=0)
        squares += (chunk * chunk).sum(axis=0)
    # exact integers up to here; n·Σx² − (Σx)² = n(n−1)·var, computed in Python ints
    spread = [n * int(q) - int(t) * int(t) for q, t in zip(squares, total, strict=True)]
    mean = total.astype(np.float64) / n * SCALE
    std = np.sqrt(np.asarray(spread, np.float64) / (n * (n - 1))) * SCALE
    return mean.astype(np.float32), std.astype(np.float32)


def prepare_speech_commands(
    source: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    force: bool = False,
) -> PreparedDataset:
    """Prepare Speech Commands v0.02 (35 classes): x (N, 16000, 1) float32, standardised per step.

    **Arguments:**
    - `source`: the extracted archive (the folder holding the word folders and the list files),
      or a folder holding it as `SpeechCommands/` or `speech_commands_v0.02/`
      (default `data_root() / "speech_commands"`).
    - `out`: output folder (default `data_root() / "prepared" / "speech35"`); reused when it was
      prepared from the same source with the same options, unless `force`.

    **Returns:** the `PreparedDataset` with splits train, val, test (16 kHz) and val_8khz,
    test_8khz (every second sample, L = 8000; evaluate with step_rescale 2).
    """
    name = "speech35"
    source = resolve_source(source, DEFAULT_SOURCE)
    out = default_out(out, name)
    options = {"version": _VERSION, "length": LENGTH, "eps": EPS, "decimation": 2}
    if not force and (ready := reuse_prepared(out, name, source, options)) is not None:
        return ready
    root = _locate(source)
    listing = _assign(root)
    total = sum(len(v) for v in listing.values())

    with Scratch(out) as scratch:
        raw = {}
        done = 0
        for split, clips in listing.items():
            raw[split] = scratch.array(f"{split}_raw", (len(clips), LENGTH), np.int16)
            for row, (path, _) in enumerate(clips):
                if done % 5000 == 0:
                    progress(name, f"reading wav files {done}/{total} from {root}")
                done += 1
                samples = read_wav(path)
                if len(samples) > LENGTH:
                    raise DatasetError(
                        f"{path} holds {len(samples)} samples; Speech Commands clips are at most "
                        f"{LENGTH} (1 s at {SAMPLE_RATE} Hz)"
                    )
                raw[split][row, : len(samples)] = samples
        progress(name, "normalising with per-time-step train statistics")
        mean, std = _train_statistics(raw["train"])
        denominator = std + np.float32(EPS)
        splits = {}
        for split, clips in listing.items():
            labels = np.asarray([label for _, label in clips], np.int32)
            x = scratch.array(f"{split}_x", (len(clips), LENGTH, 1), np.float32)
            for start in range(0, len(clips), _CHUNK):
                chunk = raw[split][start : start + _CHUNK].astype(np.float32) * np.float32(SCALE)
                x[start : start + _CHUNK, :, 0] = (chunk - mean) / denominator
            splits[split] = Split(x=x, y=labels)
            if split != "train":
                splits[f"{split}_8khz"] = Split(x=x[:, ::2], y=labels)
        meta = {
            "source": str(source.resolve()),
            "root": str(root.resolve()),
            "options": options,
            "classes": list(CLASSES),
            "sample_rate": {
                "train": SAMPLE_RATE,
                "val": SAMPLE_RATE,
                "test": SAMPLE_RATE,
                "val_8khz": SAMPLE_RATE // 2,
                "test_8khz": SAMPLE_RATE // 2,
            },
            "step_rescale": {"val_8khz": 2.0, "test_8khz": 2.0},
            "description": (
                "Speech Commands v0.02, 35 classes: int16/2^30, zero-padded to 16000, "
                "per-time-step standardised with train mean and std (+1e-5); *_8khz keep every "
                "second sample"
            ),
            "sizes": {k: len(v) for k, v in splits.items()},
        }
        dataset = PreparedDataset(name, "classification", splits, len(CLASSES), None, meta)
        progress(name, f"writing {out}")
        return scratch.finish(dataset)
