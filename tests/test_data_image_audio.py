"""Readers of users' local copies: CIFAR-10 (LRA Image, sCIFAR), MNIST (sMNIST, psMNIST),
LRA Pathfinder / Path-X, Speech Commands v0.02 (SC35), and the torch-compatible splits.

Every fixture is written in tmp_path, in the dataset's real on-disk format (`_fixtures.py`);
each test states which two views must agree (our reading vs the reference pipeline's
arithmetic, spec section).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from s5jax.data import DatasetError, load_prepared
from s5jax.data._cifar import grayscale_l, prepare_image, prepare_scifar
from s5jax.data._mnist import bitreversal_permutation, prepare_psmnist, prepare_smnist
from s5jax.data._pathfinder import prepare_pathfinder
from s5jax.data._speech import CLASSES, prepare_speech_commands
from s5jax.data.splits import (
    random_split_indices,
    shipped_permutation,
    split_permutation,
    torch_randperm,
    train_val_lengths,
    train_val_test_lengths,
)

from ._fixtures import (
    idx_bytes,
    write_cifar,
    write_mnist,
    write_pathfinder,
    write_speech,
    write_wav,
)

F32 = np.float32


def _no_leftovers(out: Path) -> None:
    """A failed prepare leaves neither the output folder nor a hidden scratch folder."""
    assert not out.exists()
    if out.parent.exists():
        assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []


# ----------------------------------------------------------------------------- splits (§5)


def test_port_reproduces_the_shipped_torch_permutations():
    """torch_randperm (numpy port) == torch.randperm saved by make_splits.py, bit for bit."""
    for n in (50_000, 60_000):
        shipped = shipped_permutation(n, 42)
        assert shipped is not None and shipped.shape == (n,)
        np.testing.assert_array_equal(torch_randperm(n, 42), shipped)
        np.testing.assert_array_equal(np.sort(shipped), np.arange(n))
    assert shipped_permutation(123, 42) is None


def test_port_matches_torch_for_the_pathfinder_size():
    """sha256 of torch.randperm(200000, manual_seed(42)) as int64, taken with torch 2.13.0."""
    perm = torch_randperm(200_000, 42)
    digest = hashlib.sha256(perm.astype("<i8").tobytes()).hexdigest()
    assert digest == "ee4e53fa9a9cb4316c55a0d184c7aa8fd2f92e97453e62e49195c42034a31789"
    np.testing.assert_array_equal(perm[:5], [37542, 143173, 127710, 58234, 152906])


def test_split_lengths_follow_the_reference_formulas():
    assert train_val_lengths(60_000) == [54_000, 6_000]
    assert train_val_lengths(50_000) == [45_000, 5_000]
    assert train_val_test_lengths(200_000) == [160_000, 20_000, 20_000]
    assert train_val_test_lengths(199_999) == [160_001, 19_999, 19_999]
    parts = random_split_indices(10, [8, 1, 1])
    np.testing.assert_array_equal(np.concatenate(parts), split_permutation(10))
    assert [len(p) for p in parts] == [8, 1, 1]


def test_port_and_normalisation_equal_torchs_saved_outputs():
    """torch_randperm and our CIFAR normalisation == torch's, as saved in torch_reference.npz.

    `scripts/make_splits.py` wrote the file with torch 2.13.0 (`write_test_reference`), and
    its rerun then reproduced the shipped split files byte for byte; no torch is needed here.
    """
    path = Path(__file__).resolve().parent / "torch_reference.npz"
    with np.load(path) as saved:
        for name in (k for k in saved.files if k.startswith("perm_")):
            _, n, seed = name.split("_")
            np.testing.assert_array_equal(torch_randperm(int(n), int(seed)), saved[name])
        # ToTensor + Normalize in torch's float32 arithmetic == ours (CIFAR grayscale constants)
        values = np.arange(256, dtype=np.uint8)
        ours = (values.astype(F32) / F32(255) - F32(122.6 / 255)) / F32(61.0 / 255)
        np.testing.assert_array_equal(ours, saved["cifar_gray"])
        assert len([k for k in saved.files if k.startswith("perm_")]) == 4


# ----------------------------------------------------------------------------- CIFAR (§2.5, §4)


def test_grayscale_is_pillows_integer_formula():
    """grayscale_l == Pillow convert("L") on random images and on known pixels."""
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (5, 3072), dtype=np.uint8)
    data[0, [0, 1024, 2048]] = (255, 0, 0)  # pure red: (19595·255 + 32768) >> 16 = 76
    data[0, [1, 1025, 2049]] = (0, 255, 0)  # pure green: 150
    data[0, [2, 1026, 2050]] = (0, 0, 255)  # pure blue: 29
    data[0, [3, 1027, 2051]] = (255, 255, 255)
    gray = grayscale_l(data)
    assert gray[0, :4].tolist() == [76, 150, 29, 255]
    for row, luma in zip(data, gray):
        rgb = row.reshape(3, 32, 32).transpose(1, 2, 0)
        pillow = np.asarray(Image.fromarray(rgb, "RGB").convert("L")).reshape(-1)
        np.testing.assert_array_equal(luma, pillow)


def test_lra_image_values_and_split(tmp_path):
    written = write_cifar(tmp_path / "cifar" / "cifar-10-batches-py")
    ds = prepare_image(tmp_path / "cifar", tmp_path / "out")
    assert ds.name == "image" and ds.n_classes == 10 and ds.vocab_size is None
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 18, "val": 2, "test": 3}
    train_data = np.concatenate([written[f"data_batch_{k}"][0] for k in range(1, 6)])
    train_labels = np.concatenate([written[f"data_batch_{k}"][1] for k in range(1, 6)])
    perm = torch_randperm(20, 42)
    gray = grayscale_l(train_data[perm])
    expected = (gray.astype(F32) / F32(255) - F32(122.6 / 255)) / F32(61.0 / 255)
    x = np.concatenate([ds.splits["train"].x, ds.splits["val"].x])
    assert x.dtype == np.float32 and x.shape == (20, 1024, 1)
    np.testing.assert_array_equal(x[:, :, 0], expected)
    np.testing.assert_allclose(x[:, :, 0], (gray - 122.6) / 61.0, atol=1e-5)
    y = np.concatenate([ds.splits["train"].y, ds.splits["val"].y])
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, train_labels[perm])
    test_gray = grayscale_l(written["test_batch"][0])
    np.testing.assert_allclose(ds.splits["test"].x[:, :, 0], (test_gray - 122.6) / 61.0, atol=1e-5)


def test_scifar_keeps_colour_per_channel(tmp_path):
    written = write_cifar(tmp_path / "cifar-10-batches-py")
    ds = prepare_scifar(tmp_path / "cifar-10-batches-py", tmp_path / "out")
    x = ds.splits["test"].x
    assert x.shape == (3, 1024, 3) and x.dtype == np.float32
    data = written["test_batch"][0].reshape(3, 3, 1024)  # (n, c, h·w)
    mean, std = (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)
    for c in range(3):
        expected = (data[:, c].astype(F32) / F32(255) - F32(mean[c])) / F32(std[c])
        np.testing.assert_array_equal(x[:, :, c], expected)
    # pixel p of row-major 32×32 is (h, w) = divmod(p, 32): check one against the raw layout
    assert x[1, 33, 2] == (F32(data[1, 2, 33]) / F32(255) - F32(mean[2])) / F32(std[2])


def test_cifar_bad_pickle_names_the_file(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder)
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(DatasetError, match="data_batch_3"):
        prepare_image(folder, tmp_path / "out")
    _no_leftovers(tmp_path / "out")


def test_cifar_pickle_cannot_run_code(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder)
    (folder / "test_batch").write_bytes(pickle.dumps(print, protocol=2))
    with pytest.raises(DatasetError, match="test_batch"):
        prepare_image(folder, tmp_path / "out")


# ----------------------------------------------------------------------------- MNIST (§4)


def test_bitreversal_permutation_matches_the_spec():
    p = bitreversal_permutation(784)
    np.testing.assert_array_equal(np.sort(p), np.arange(784))
    assert p[:16].tolist() == [0, 512, 256, 768, 128, 640, 384, 64, 576, 320, 192, 704, 448, 32,
                               544, 288]  # fmt: skip
    assert p[-8:].tolist() == [703, 447, 127, 639, 383, 255, 767, 511]


@pytest.mark.parametrize("gz", [True, False])
def test_smnist_values_and_split(tmp_path, gz):
    arrays = write_mnist(tmp_path / "mnist" / "MNIST" / "raw", gz=gz)
    ds = prepare_smnist(tmp_path / "mnist", tmp_path / "out")
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 18, "val": 2, "test": 5}
    assert ds.n_classes == 10 and ds.vocab_size is None
    pixels = arrays["train-images-idx3-ubyte"].reshape(20, 784)
    perm = torch_randperm(20, 42)
    x = np.concatenate([ds.splits["train"].x, ds.splits["val"].x])
    assert x.shape == (20, 784, 1) and x.dtype == np.float32
    np.testing.assert_array_equal(x[:, :, 0], pixels[perm].astype(F32) / F32(255))
    y = np.concatenate([ds.splits["train"].y, ds.splits["val"].y])
    np.testing.assert_array_equal(y, arrays["train-labels-idx1-ubyte"][perm])
    test = arrays["t10k-images-idx3-ubyte"].reshape(5, 784)
    np.testing.assert_array_equal(ds.splits["test"].x[:, :, 0], test.astype(F32) / F32(255))
    assert ds.splits["test"].x.max() <= 1.0 and ds.splits["test"].x.min() >= 0.0


def test_psmnist_applies_the_bitreversal_permutation(tmp_path):
    write_mnist(tmp_path / "raw", gz=True)
    plain = prepare_smnist(tmp_path, tmp_path / "s")
    permuted = prepare_psmnist(tmp_path, tmp_path / "ps")
    p = bitreversal_permutation(784)
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(permuted.splits[split].x, plain.splits[split].x[:, p])
        np.testing.assert_array_equal(permuted.splits[split].y, plain.splits[split].y)


def test_mnist_bad_idx_names_the_file(tmp_path):
    source = tmp_path / "mnist"
    write_mnist(source, gz=False)
    # 4 labels for 5 images
    (source / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(4), 2049))
    with pytest.raises(DatasetError, match="t10k-labels-idx1-ubyte"):
        prepare_smnist(source, tmp_path / "out")
    (source / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x02garbage")
    with pytest.raises(DatasetError, match="t10k-labels-idx1-ubyte"):
        prepare_smnist(source, tmp_path / "out")
    # a label of 10 (ten classes: 0-9)
    (source / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.array([0, 1, 10, 2, 3]), 2049))
    with pytest.raises(DatasetError, match=r"t10k-labels-idx1-ubyte: labels must lie in 0\.\.9"):
        prepare_smnist(source, tmp_path / "out")
    # bytes after the data the header announces (a concatenated or damaged file)
    good = idx_bytes(np.array([0, 1, 9, 2, 3]), 2049)
    (source / "t10k-labels-idx1-ubyte").write_bytes(good + b"\x00")
    with pytest.raises(DatasetError, match=r"announces shape \(5,\) \(5 bytes\) but the file "
                       r"holds 6 data bytes"):  # fmt: skip
        prepare_smnist(source, tmp_path / "out")
    _no_leftovers(tmp_path / "out")


# ----------------------------------------------------------------------------- Pathfinder (§2.2)


def test_pathfinder_values_order_and_split(tmp_path):
    _, images, labels = write_pathfinder(tmp_path / "lra_release" / "lra_release")
    ds = prepare_pathfinder(tmp_path, tmp_path / "out", resolution=32)
    assert ds.name == "pathfinder" and ds.n_classes == 2
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 8, "val": 1, "test": 1}
    perm = torch_randperm(10, 42)
    x = np.concatenate([ds.splits[s].x for s in ("train", "val", "test")])
    y = np.concatenate([ds.splits[s].y for s in ("train", "val", "test")])
    assert x.shape == (10, 1024, 1) and x.dtype == np.float32
    pixels = np.stack(images).reshape(10, 1024)[perm]
    expected = (pixels.astype(F32) / F32(255) - F32(0.5)) / F32(0.5)
    np.testing.assert_array_equal(x[:, :, 0], expected)
    np.testing.assert_array_equal(y, np.asarray(labels)[perm])
    assert x.min() == -1.0 and x.max() == 1.0
    assert np.all(x[:, 0, 0] == -1.0) and np.all(x[:, 1, 0] == 1.0)


def test_pathx_reads_128_pixel_images(tmp_path):
    write_pathfinder(tmp_path, resolution=128)
    ds = prepare_pathfinder(tmp_path / "pathfinder128", tmp_path / "out", resolution=128)
    assert ds.name == "pathx" and ds.splits["train"].x.shape == (8, 16384, 1)


def test_pathfinder_blacklisted_file_is_skipped(tmp_path):
    root, _, _ = write_pathfinder(tmp_path, difficulty="curv_baseline", n=11)
    (root / "imgs" / "0").mkdir()
    (root / "imgs" / "0" / "sample_172.png").write_bytes(b"")  # the release's empty file
    (root / "metadata" / "0.npy").write_text("imgs/0 sample_172.png 172 1 1.0 6 2 2 0.5 1 1\n")
    ds = prepare_pathfinder(tmp_path, tmp_path / "out", difficulty="curv_baseline")
    assert sum(len(s) for s in ds.splits.values()) == 11


def test_pathfinder_unreadable_png_names_the_file(tmp_path):
    root, _, _ = write_pathfinder(tmp_path)
    bad = root / "imgs" / "10" / "sample_3.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(DatasetError, match=re.escape(str(bad))):
        prepare_pathfinder(tmp_path, tmp_path / "out")
    _no_leftovers(tmp_path / "out")


@pytest.mark.parametrize("label", ["2", "-1", "x"])
def test_pathfinder_metadata_label_other_than_0_or_1_names_the_line(tmp_path, label):
    root, _, _ = write_pathfinder(tmp_path)
    meta = root / "metadata" / "10.npy"
    lines = meta.read_text().splitlines()
    fields = lines[1].split()
    fields[3] = label
    lines[1] = " ".join(fields)
    meta.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"10\.npy:2: expected .*<label 0/1>"):
        prepare_pathfinder(tmp_path, tmp_path / "out")
    _no_leftovers(tmp_path / "out")


def test_pathfinder_too_few_images_is_an_empty_split(tmp_path):
    write_pathfinder(tmp_path, n=9)  # int(0.1 · 9) = 0 val images
    with pytest.raises(DatasetError, match="metadata"):
        prepare_pathfinder(tmp_path, tmp_path / "out")
    _no_leftovers(tmp_path / "out")


# ----------------------------------------------------------------------------- Speech (§3)


def test_class_order_is_the_reference_list():
    assert len(CLASSES) == 35 and len(set(CLASSES)) == 35
    assert CLASSES[:3] == ("bed", "cat", "down") and CLASSES[16:18] == ("yes", "backward")
    assert CLASSES[-1] == "zero"


def test_speech_padding_scaling_normalisation_and_8khz(tmp_path):
    clips = write_speech(tmp_path / "SpeechCommands")
    # what else a word folder may hold (a copy's notes, a desktop's metadata) is not a clip
    (tmp_path / "SpeechCommands" / "bed" / "README.md").write_text("notes\n")
    (tmp_path / "SpeechCommands" / "yes" / ".DS_Store").write_bytes(b"\x00\x01")
    ds = prepare_speech_commands(tmp_path, tmp_path / "out")
    assert ds.name == "speech35" and ds.n_classes == 35 and ds.vocab_size is None
    sizes = {k: len(v) for k, v in ds.splits.items()}
    assert sizes == {"train": 8, "val": 2, "test": 2, "val_8khz": 2, "test_8khz": 2}
    # class order (bed 0, yes 16; backward 17, zero 34), then file name
    val_keys = ["bed/spk1_nohash_0.wav", "yes/spk0_nohash_0.wav"]
    test_keys = ["backward/spk1_nohash_0.wav", "zero/spk0_nohash_0.wav"]
    train_keys = [k for k in sorted(clips, key=lambda k: (clips[k][1], k))
                  if k not in val_keys + test_keys]  # fmt: skip

    def padded(keys):
        out = np.zeros((len(keys), 16_000), np.int64)
        for row, key in enumerate(keys):
            out[row, : len(clips[key][0])] = clips[key][0]
        return out

    train = padded(train_keys) * 2.0**-30  # torchaudio /2**15, then the reference's /2**15
    mean, std = train.mean(axis=0), train.std(axis=0, ddof=1)
    for split, keys in (("train", train_keys), ("val", val_keys), ("test", test_keys)):
        x, y = ds.splits[split].x, ds.splits[split].y
        assert x.shape == (len(keys), 16_000, 1) and x.dtype == np.float32 and y.dtype == np.int32
        assert y.tolist() == [clips[k][1] for k in keys]
        expected = (padded(keys) * 2.0**-30 - mean) / (std + 1e-5)
        np.testing.assert_allclose(x[:, :, 0], expected, rtol=1e-5, atol=1e-6)
        # the exact float32 recipe: int16·2^-30, minus f32 mean, over (f32 std + f32 1e-5)
        exact = (padded(keys).astype(F32) * F32(2.0**-30) - mean.astype(F32)) / (
            std.astype(F32) + F32(1e-5)
        )
        np.testing.assert_array_equal(x[:, :, 0], exact)
        # zero padding after the short clip: the padded steps hold (0 − m_t)/(s_t + 1e-5)
        short = [row for row, k in enumerate(keys) if len(clips[k][0]) < 16_000]
        assert len(short) >= 1
        for row in short:
            np.testing.assert_allclose(
                x[row, 12_345:, 0], -mean[12_345:] / (std[12_345:] + 1e-5), rtol=1e-5
            )
    for split in ("val", "test"):
        np.testing.assert_array_equal(ds.splits[f"{split}_8khz"].x, ds.splits[split].x[:, ::2])
        assert ds.splits[f"{split}_8khz"].x.shape[1] == 8000
        np.testing.assert_array_equal(ds.splits[f"{split}_8khz"].y, ds.splits[split].y)
    assert ds.meta["step_rescale"] == {"val_8khz": 2.0, "test_8khz": 2.0}


@pytest.mark.parametrize("rate, channels", [(8_000, 1), (16_000, 2)])
def test_speech_wrong_format_names_the_file(tmp_path, rate, channels):
    write_speech(tmp_path)
    bad = tmp_path / "cat" / "bad_nohash_0.wav"
    write_wav(bad, np.zeros(100 * channels, np.int16), rate=rate, channels=channels)
    with pytest.raises(DatasetError, match=re.escape(str(bad))):
        prepare_speech_commands(tmp_path, tmp_path / "out")
    _no_leftovers(tmp_path / "out")


def test_speech_empty_split_names_the_list(tmp_path):
    write_speech(tmp_path)
    (tmp_path / "testing_list.txt").write_text("cat/not_there.wav\n")
    with pytest.raises(DatasetError, match=re.escape("testing_list.txt")):
        prepare_speech_commands(tmp_path, tmp_path / "out")
    _no_leftovers(tmp_path / "out")


def test_speech_missing_class_folder(tmp_path):
    write_speech(tmp_path)
    (tmp_path / "wow").rmdir()
    with pytest.raises(DatasetError, match="wow"):
        prepare_speech_commands(tmp_path, tmp_path / "out")


# ----------------------------------------------------------------------------- shared behaviour


MISSING = [
    (prepare_image, "cifar-10-python.tar.gz", "cifar", "image"),
    (prepare_scifar, "cifar-10-python.tar.gz", "cifar", "scifar"),
    (prepare_smnist, "train-images-idx3-ubyte.gz", "mnist", "smnist"),
    (prepare_psmnist, "t10k-labels-idx1-ubyte.gz", "mnist", "psmnist"),
    (prepare_pathfinder, "lra_release.gz", "lra_release/lra_release/pathfinder32", "pathfinder"),
    (prepare_speech_commands, "speech_commands_v0.02.tar.gz", "speech_commands", "speech35"),
]


@pytest.mark.parametrize("prepare, archive, default, name", MISSING)
def test_missing_data_says_what_to_download_and_where(tmp_path, monkeypatch, prepare, archive,
                                                      default, name):  # fmt: skip
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    with pytest.raises(DatasetError) as info:
        prepare()
    message = str(info.value)
    assert archive in message
    assert str(tmp_path / "root" / default) in message
    assert "http" not in message and "S5JAX_DATA" in message
    _no_leftovers(tmp_path / "root" / "prepared" / name)


def test_prepare_is_idempotent_and_cached(tmp_path, capsys):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder)
    first = prepare_image(folder, tmp_path / "out")
    assert "[s5jax.data] image: reading" in capsys.readouterr().err
    stamp = (tmp_path / "out" / "meta.json").stat().st_mtime_ns
    (folder / "data_batch_1").unlink()  # a reuse must not read the source again
    again = prepare_image(folder, tmp_path / "out")
    assert (tmp_path / "out" / "meta.json").stat().st_mtime_ns == stamp
    assert capsys.readouterr().err == ""
    np.testing.assert_array_equal(again.splits["train"].x, first.splits["train"].x)
    assert isinstance(again.splits["train"].x, np.memmap)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())["meta"]
    assert meta["source"] == str(folder.resolve()) and meta["options"]["colour"] is False
    with pytest.raises(DatasetError, match="data_batch_1"):  # force re-reads
        prepare_image(folder, tmp_path / "out", force=True)
    assert load_prepared(tmp_path / "out").splits["train"].x.shape == (18, 1024, 1)  # kept
    with pytest.raises(DatasetError):  # other options (colour) do not reuse the grayscale output
        prepare_scifar(folder, tmp_path / "out")
