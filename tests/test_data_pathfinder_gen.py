"""The seeded Pathfinder / Path-X generator: release layout, determinism, and the geometry of
the paths (markers connected exactly when the label says so, paths never touching)."""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from s5jax.cli import main
from s5jax.data import DatasetError, generate_pathfinder, load_prepared
from s5jax.data._pathfinder import prepare_pathfinder, read_pathfinder_metadata
from s5jax.data._pathfinder_gen import _Sampler, lra_pathfinder_params

DIFFICULTY = "curv_contour_length_14"


def _components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """8-connected components of a boolean image by breadth-first flood fill: labels 1..n."""
    labels = np.zeros(mask.shape, dtype=np.int32)
    n = 0
    height, width = mask.shape
    for y0, x0 in zip(*np.nonzero(mask), strict=True):
        if labels[y0, x0]:
            continue
        n += 1
        labels[y0, x0] = n
        queue = deque([(y0, x0)])
        while queue:
            y, x = queue.popleft()
            for yy in range(max(y - 1, 0), min(y + 2, height)):
                for xx in range(max(x - 1, 0), min(x + 2, width)):
                    if mask[yy, xx] and not labels[yy, xx]:
                        labels[yy, xx] = n
                        queue.append((yy, xx))
    return labels, n


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_flood_fill_helper():
    mask = np.zeros((5, 6), dtype=bool)
    mask[0, 0] = mask[1, 1] = True  # diagonal neighbours: one component
    mask[3, 3] = mask[3, 5] = True  # a gap of one pixel: two components
    labels, n = _components(mask)
    assert n == 3 and labels[0, 0] == labels[1, 1] != labels[3, 3] != labels[3, 5]


@pytest.mark.parametrize(("resolution", "n"), [(32, 60), (128, 6)])
def test_markers_are_connected_exactly_for_positives_and_paths_never_touch(resolution, n):
    params = lra_pathfinder_params(resolution)
    sampler = _Sampler(params, np.random.default_rng(7))
    for k in range(n):
        sample = sampler.sample(k % 2)
        image, paths = sample.image, sample.paths
        assert image.shape == paths.shape == (resolution, resolution) and image.dtype == np.uint8
        drawn = image > 0
        # every drawn pixel (paddles and markers) lies on the trace of exactly one path
        assert np.all(paths[drawn] > 0)
        ids = np.unique(paths[paths > 0])
        assert {1, 2} <= set(ids.tolist())
        assert len(ids) <= 2 + params.num_distractor_snakes
        # flood fill over all traces: one component per path, so no two paths touch, not even
        # diagonally, and each path is one connected curve
        labels, count = _components(paths > 0)
        assert count == len(ids)
        for ident in ids:
            assert len(np.unique(labels[paths == ident])) == 1
        (ay, ax), (by, bx) = sample.markers
        assert paths[ay, ax] in (1, 2) and paths[by, bx] in (1, 2)
        assert (labels[ay, ax] == labels[by, bx]) == (sample.label == 1)
        assert image[ay, ax] == image[by, bx] == params.marker_value
        # the paths are dashed: each target is drawn as many separate paddles
        for ident in (1, 2):
            paddles = drawn & (paths == ident) & (image == params.path_value)
            assert _components(paddles)[1] >= params.contour_length // 3
        # nothing is drawn within the padding ring
        assert not drawn[0].any() and not drawn[-1].any()
        assert not drawn[:, 0].any() and not drawn[:, -1].any()


def test_layout_determinism_and_reading_back(tmp_path):
    params = dataclasses.replace(lra_pathfinder_params(32), images_per_batch=10)
    kw = {"resolution": 32, "n_images": 25, "params": params, "progress": False}
    first = generate_pathfinder(tmp_path / "a", seed=3, **kw)
    generate_pathfinder(tmp_path / "b", seed=3, **kw)
    generate_pathfinder(tmp_path / "c", seed=4, **kw)
    assert first == tmp_path / "a" / "pathfinder32"
    files = _files(tmp_path / "a")
    assert files == _files(tmp_path / "b")  # same seed: byte-identical files
    other = _files(tmp_path / "c")
    assert files.keys() == other.keys()
    assert sum(files[k] != other[k] for k in files if k.endswith(".png")) > 20

    root = first / DIFFICULTY
    assert sorted(p.name for p in (root / "metadata").iterdir()) == ["0.npy", "1.npy", "2.npy"]
    assert sorted(p.name for p in (root / "imgs").iterdir()) == ["0", "1", "2"]
    assert not [p for p in root.rglob("*") if p.name.startswith(".")]  # no temporary files
    lines = (root / "metadata" / "2.npy").read_text().splitlines()
    assert len(lines) == 5
    fields = lines[4].split()
    assert fields[:3] == ["imgs/2", "sample_4.png", "4"] and fields[3] in ("0", "1")
    assert fields[4:] == ["1.0", "14", "4", "2", "0.5", "1", "1"]
    provenance = json.loads((root / "generator.json").read_text())
    assert provenance["generated"] is True and provenance["seed"] == 3
    assert provenance["params"]["resolution"] == 32 and provenance["n_images"] == 25

    samples = read_pathfinder_metadata(first)
    labels = np.array([label for _, label in samples])
    assert len(samples) == 25 and sorted(np.bincount(labels).tolist()) == [12, 13]
    pixels = []
    for relative, _ in samples:
        with Image.open(first / relative) as im:
            assert im.format == "PNG" and im.mode == "L" and im.size == (32, 32)
            pixels.append(np.asarray(im))
    pixels = np.stack(pixels)
    assert pixels.dtype == np.uint8
    assert set(np.unique(pixels).tolist()) == {0, params.path_value, params.marker_value}

    ds = prepare_pathfinder(tmp_path / "a", tmp_path / "prepared", resolution=32)
    assert ds.name == "pathfinder" and ds.n_classes == 2
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 21, "val": 2, "test": 2}
    x = np.concatenate([np.asarray(s.x) for s in ds.splits.values()])
    y = np.concatenate([np.asarray(s.y) for s in ds.splits.values()])
    assert x.shape == (25, 1024, 1) and x.dtype == np.float32
    assert x.min() == -1.0 and x.max() == 1.0
    assert sorted(np.bincount(y).tolist()) == [12, 13]
    # the reader's rows are the PNGs scaled to [-1, 1], in some order
    half = np.float32(0.5)
    scaled = (pixels.reshape(25, -1).astype(np.float32) / np.float32(255) - half) / half
    assert {row.tobytes() for row in x[:, :, 0]} == {row.tobytes() for row in scaled}


def test_path_x_images_are_128_pixels(tmp_path):
    folder = generate_pathfinder(tmp_path, resolution=128, n_images=3, seed=0, progress=False)
    lines = (folder / DIFFICULTY / "metadata" / "0.npy").read_text().splitlines()
    assert [line.split()[3] for line in lines].count("1") in (1, 2)
    assert {line.split()[9] for line in lines} <= {"2", "3"}  # the paddle margin, per image
    with Image.open(folder / DIFFICULTY / "imgs" / "0" / "sample_2.png") as im:
        assert im.mode == "L" and im.size == (128, 128)


def test_bad_arguments_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="resolution"):
        generate_pathfinder(tmp_path, resolution=64, n_images=4)
    with pytest.raises(ValueError, match="resolution"):
        generate_pathfinder(tmp_path, resolution=32.0, n_images=4)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="n_images"):
            generate_pathfinder(tmp_path, resolution=32, n_images=bad)
    with pytest.raises(ValueError, match="seed"):
        generate_pathfinder(tmp_path, resolution=32, n_images=4, seed=-1)
    with pytest.raises(ValueError, match="resolution"):
        lra_pathfinder_params(256)
    with pytest.raises(ValueError, match=r"params\.resolution"):
        generate_pathfinder(tmp_path, resolution=128, n_images=4, params=lra_pathfinder_params(32))
    assert not (tmp_path / "pathfinder32").exists()


def test_unplaceable_paths_raise_a_clear_error(tmp_path):
    params = dataclasses.replace(
        lra_pathfinder_params(32), contour_length=80, max_target_attempts=300
    )
    with pytest.raises(DatasetError, match="could not place the two 80-paddle target paths"):
        generate_pathfinder(tmp_path, resolution=32, n_images=2, params=params, progress=False)
    assert not (tmp_path / "pathfinder32" / DIFFICULTY).exists()  # nothing half-written


def test_replaces_only_its_own_output(tmp_path):
    kw = {"resolution": 32, "n_images": 2, "progress": False}
    generate_pathfinder(tmp_path, seed=1, **kw)
    with pytest.raises(DatasetError, match="already exists"):
        generate_pathfinder(tmp_path, seed=2, **kw)
    generate_pathfinder(tmp_path, seed=2, overwrite=True, **kw)
    assert (
        json.loads((tmp_path / "pathfinder32" / DIFFICULTY / "generator.json").read_text())["seed"]
        == 2
    )
    release = tmp_path / "release" / "pathfinder32" / DIFFICULTY / "metadata"
    release.mkdir(parents=True)
    (release / "0.npy").write_text("imgs/0 sample_0.png 0 1\n")
    with pytest.raises(DatasetError, match="may be the LRA release"):
        generate_pathfinder(tmp_path / "release", overwrite=True, **kw)
    assert (release / "0.npy").read_text() == "imgs/0 sample_0.png 0 1\n"


def test_cli_generates_and_prepares(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path))
    assert main(["data", "prepare", "pathfinder", "--generate", "--count", "20"]) == 0
    root = tmp_path / "generated" / "pathfinder32" / DIFFICULTY
    assert json.loads((root / "generator.json").read_text())["generated"] is True
    ds = load_prepared(tmp_path / "prepared" / "pathfinder")
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 16, "val": 2, "test": 2}
    assert ds.splits["train"].x.shape == (16, 1024, 1)
    assert "pathfinder" in capsys.readouterr().out
    # again with another count and seed: the generated folder and the cache are replaced
    assert (
        main(["data", "prepare", "pathfinder", "--generate", "--count", "10", "--seed", "1"]) == 0
    )
    assert len(load_prepared(tmp_path / "prepared" / "pathfinder").splits["train"]) == 8
    assert main(["data", "prepare", "pathx", "--generate", "--count", "10"]) == 0
    assert load_prepared(tmp_path / "prepared" / "pathx").splits["val"].x.shape == (1, 16384, 1)
    capsys.readouterr()
    assert main(["data", "prepare", "pathfinder", "--generate", "--count", "0"]) == 2
    assert "--count" in capsys.readouterr().err
    assert main(["data", "prepare", "listops", "--generate", "--count", "5"]) == 2
    assert "--count" in capsys.readouterr().err
    assert main(["data", "prepare", "text", "--generate"]) == 2
    assert "pathfinder" in capsys.readouterr().err
    # --count and --seed without --generate are an error, not silently ignored
    for extra in (["--count", "5"], ["--seed", "3"]):
        assert main(["data", "prepare", "pathfinder", *extra]) == 2
        err = capsys.readouterr().err
        assert extra[0] in err and "--generate" in err
