"""Vocabularies and padded token arrays shared by the LRA text tasks (ListOps, Text, Retrieval).

The reference pipeline (S4/S5, `datasets.md` §2.1, §2.3, §2.4, §5) tokenises each example,
truncates it to `l_max - 1` tokens, appends `<eos>`, builds a torchtext vocabulary from the
*truncated* train tokens and pads batches with `<pad>`. We reproduce that without torchtext:

- `build_vocab` is `torchtext.vocab.build_vocab_from_iterator`: specials first in the given
  order, then the tokens with count >= `min_freq` by descending count, ties broken by Python
  string order (for one character: code point order). Unknown tokens map to `<unk>`.
- Examples are read once into a *key* array: every token becomes a non-negative integer key
  (a character's code point, or an id in first-seen order for word tokens), `<eos>` is
  `EOS_KEY` and padding `PAD_KEY`. Counting keys of the train split gives the vocabulary;
  one table lookup (`remap_in_place`) then turns keys into final ids. Keys live in a scratch
  memory map so the 4.7 GB AAN train array never has to fit in memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from ._common import DatasetError, log, progress_factory
from ._prepared import PreparedDataset, load_prepared

__all__ = [
    "EOS_ID",
    "PAD_ID",
    "SPECIALS",
    "UNK_ID",
    "build_vocab",
]

PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"
SPECIALS = (PAD, UNK, EOS)
PAD_ID, UNK_ID, EOS_ID = 0, 1, 2

# Keys below zero are the two specials a row can hold before the final mapping.
PAD_KEY, EOS_KEY = -1, -2
_KEY_OFFSET = 2  # table index of key k is k + 2 (so EOS_KEY -> 0, PAD_KEY -> 1)
N_CODEPOINTS = 0x110000
_CHUNK_ROWS = 1024


def build_vocab(
    counts: Mapping[str, int], *, min_freq: int = 1, specials: Sequence[str] = SPECIALS
) -> list[str]:
    """The torchtext vocabulary (index -> token) for token `counts`.

    **Arguments:**
    - `counts`: how often each token occurs (after truncation) in the train split.
    - `min_freq`: tokens rarer than this are left out (they become `<unk>`).
    - `specials`: tokens placed first, in this order, whether or not they occur.

    **Returns:** the list of tokens; a token's index is its id.
    """
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    special_set = set(specials)
    tokens = [t for t, c in ordered if c >= min_freq and t not in special_set]
    return [*specials, *tokens]


def char_keys(text: str, max_len: int) -> np.ndarray:
    """Code points of the first `max_len` characters of `text` (= `list(text)[:max_len]`)."""
    return np.frombuffer(text[:max_len].encode("utf-32-le"), dtype="<u4").astype(np.int32)


def write_row(row: np.ndarray, keys: np.ndarray) -> int:
    """Fill one row with `keys`, then `<eos>`, then padding; return the length incl. `<eos>`.

    `keys` must already be truncated to `len(row) - 1`.
    """
    n = len(keys)
    row[:n] = keys
    row[n] = EOS_KEY
    row[n + 1 :] = PAD_KEY
    return n + 1


def count_keys(x: np.ndarray, n_keys: int) -> np.ndarray:
    """How often each non-negative key occurs in the key array `x` (any shape, rows first)."""
    counts = np.zeros(n_keys, dtype=np.int64)
    for start in range(0, len(x), _CHUNK_ROWS):
        chunk = np.asarray(x[start : start + _CHUNK_ROWS]).ravel()
        counts += np.bincount(chunk[chunk >= 0], minlength=n_keys)
    return counts


def vocab_from_keys(
    counts: np.ndarray, key_to_token: Callable[[int], str], *, min_freq: int = 1
) -> tuple[list[str], np.ndarray]:
    """Vocabulary from key counts, and the table that maps `key + 2` to the final token id.

    Keys that are not in the vocabulary (never seen in train, or rarer than `min_freq`)
    map to `<unk>`.
    """
    seen = np.flatnonzero(counts)
    itos = build_vocab({key_to_token(int(k)): int(counts[k]) for k in seen}, min_freq=min_freq)
    stoi = {t: i for i, t in enumerate(itos)}
    table = np.full(len(counts) + _KEY_OFFSET, UNK_ID, dtype=np.int32)
    table[EOS_KEY + _KEY_OFFSET] = EOS_ID
    table[PAD_KEY + _KEY_OFFSET] = PAD_ID
    for k in seen:
        table[k + _KEY_OFFSET] = stoi.get(key_to_token(int(k)), UNK_ID)
    return itos, table


def remap_in_place(x: np.ndarray, table: np.ndarray) -> None:
    """Turn the keys in `x` into token ids with a table from `vocab_from_keys`."""
    for start in range(0, len(x), _CHUNK_ROWS):
        x[start : start + _CHUNK_ROWS] = table[x[start : start + _CHUNK_ROWS] + _KEY_OFFSET]


@contextlib.contextmanager
def scratch_dir(out: Path) -> Iterator[Path]:
    """A temporary folder beside `out` for memory-mapped work arrays; removed afterwards."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.scratch-", dir=out.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def scratch_array(folder: Path, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised int32 array of `shape` backed by a file in `folder`.

    Every row that is kept must be filled with `write_row`.
    """
    if 0 in shape:
        return np.zeros(shape, dtype=np.int32)
    return np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=np.int32, shape=shape)


def read_text_file(path: Path) -> str:
    """The UTF-8 text of `path`; a `DatasetError` naming the file if it is not valid UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"{path}: not valid UTF-8 (byte {e.start}: {e.reason}); the file is damaged, "
            "replace it with the original"
        ) from None


def count_lines(path: Path) -> int:
    """Number of lines in `path` (a last line without a newline counts)."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """`(line number, text)` for each line of `path`, without the line ending.

    A line that is not valid UTF-8 raises a `DatasetError` naming the file and line.
    """
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(
                    f"{path}, line {lineno}: not valid UTF-8 (byte {e.start}: {e.reason}); "
                    "the file is damaged, replace it with the original"
                ) from None
            yield lineno, line.rstrip("\r\n")


class Progress:
    """Progress of one preparation loop (silent when `enabled` is false).

    A bar from the installed factory (`set_progress_factory`; the `s5jax` command installs a
    tqdm bar for terminals), else a log line (logger `s5jax.data`) every `every` items.
    `step` takes the number of items done so far.
    """

    def __init__(self, label: str, total: int, *, enabled: bool, every: int):
        self.label, self.total, self.enabled, self.every = label, total, enabled, every
        factory = progress_factory() if enabled else None
        self._bar = factory(label, total) if factory is not None else None
        self._reported = 0

    def step(self, done: int) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(done - self._reported)
            self._reported = done
        elif done % self.every == 0:
            log.info("[%s] %d/%d", self.label, done, self.total)

    def done(self, n: int) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n - self._reported)
            self._reported = n
            self._bar.close()
        else:
            log.info("[%s] %d done", self.label, n)


def reuse_prepared(out: Path, provenance: dict) -> PreparedDataset | None:
    """The dataset cached in `out` if its meta records the same `provenance`, else `None`."""
    meta_path = out / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        stored = json.loads(meta_path.read_text()).get("meta", {})
    except (OSError, ValueError):
        return None
    if any(stored.get(k) != v for k, v in provenance.items()):
        return None
    try:
        return load_prepared(out)
    except DatasetError:
        return None


def resolve_source(
    source: str | os.PathLike, candidates: Sequence[str], marker: str
) -> Path | None:
    """The first of `source/<candidate>` that holds `marker`, or `None`."""
    root = Path(source).expanduser()
    for cand in candidates:
        folder = root / cand if cand else root
        if (folder / marker).exists():
            return folder.resolve()
    return None
