"""Pendulum regression data (`shared/specs/datasets.md` §1).

Physics and rendering tests check the mathematics of §1.2–1.4 directly; the reference tests
pin every figure published in §1.10 (md5 and sums of the generated observations, target
sums, first angles, clean-image sums, and S5's "Sanity Checksums" after sub-sampling).
Full generation takes a few seconds here, so the reference tests run on the full data.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from s5jax.data import DatasetError
from s5jax.data import _pendulum as pend

C = 9.81 / (1.0 / 3.0)  # c = g·L·m/I = 3g/L (§1.2)

# §1.10, published figures: obs uint8 sum, obs md5, targets sum, first θ, clean-image sum.
REFERENCE = {
    "train": (7324342474, "f56e0f03b8866d35007d41b3a00ff89b", 74758.2303728470, -0.788288,
              803876151),
    "test": (3723464974, "2a07920a44aaeca1d562fa82b7ef10f9", 37859.5143339897, 1.189365,
             402275606),
    "valid": (3694064515, "17d0c0e91463c851dede83531a8b533b", 38202.8327826353, -2.418683,
              402431177),
}  # fmt: skip
# §1.10 "Sanity Checksums": obs/255 sum, targets sum, time-point sum, first 10 choices.
SANITY = {
    "train": (14373030.227451, 37657.602830, 4957111, [0, 1, 2, 4, 5, 7, 9, 10, 11, 12]),
    "test": (7284288.349020, 18808.583486, 2481381, [0, 1, 2, 4, 6, 7, 10, 11, 14, 16]),
    "valid": (7238414.788235, 19100.230655, 2478094, [0, 1, 9, 10, 11, 12, 14, 16, 17, 18]),
}
SEED_OFFSET = {"train": 2000, "test": 0, "valid": 1000}


def energy(theta, omega):
    """Energy per unit inertia, ½ω² − c·cos θ, in the shifted convention (θ = 0 hangs down)."""
    return 0.5 * omega**2 - C * np.cos(theta)


# --------------------------------------------------------------------------------------------
# §1.2 physics


def test_energy_is_conserved_to_first_order_without_friction():
    """Symplectic Euler: the energy error is bounded, does not drift, and halves with h."""
    max_dev = {}
    for h in (1e-4, 2e-4):
        rng = np.random.RandomState(0)
        theta, omega = pend.simulate_pendulum(
            rng, 16, 201, friction=0.0, transition_noise_std=0.0, sim_dt=h
        )
        dev = np.abs(energy(theta, omega) - energy(theta[:, :1], omega[:, :1]))
        assert dev[:, 101:].max() <= 1.05 * dev[:, :101].max()  # no growth over 2 s
        max_dev[h] = dev.max()
    assert max_dev[1e-4] < 1e-3 * C
    assert 1.7 < max_dev[2e-4] / max_dev[1e-4] < 2.3


def test_small_oscillations_have_frequency_sqrt_c_and_decay_with_friction():
    """Linearised about the bottom: φ'' = −c·φ − 0.1·φ', so E ∝ exp(−0.1 t), ω_d ≈ √c."""
    theta, omega = np.full(1, np.pi + 0.05), np.zeros(1)  # internal convention: π hangs down
    e0 = energy(theta - np.pi, omega)[0]
    phis = []
    for _ in range(1000):  # 10 s
        theta, omega = pend.pendulum_substeps(theta, omega, friction=0.1)
        phis.append(theta[0] - np.pi)
    ratio = (energy(theta - np.pi, omega)[0] + C) / (e0 + C)
    assert ratio == pytest.approx(np.exp(-1.0), rel=0.03)

    phi = np.array(phis)
    k = np.nonzero(np.sign(phi[:-1]) != np.sign(phi[1:]))[0]
    crossings = (k + 1 + phi[k] / (phi[k] - phi[k + 1])) * pend.DT  # linear interpolation
    half_period = np.diff(crossings).mean()
    assert half_period == pytest.approx(np.pi / np.sqrt(C - 0.1**2 / 4), rel=2e-3)


def test_simulation_range_and_rng_call_order():
    """θ ∈ [−π, π); the draws are θ₀ (n, 1) then one normal(n) per transition (§1.5)."""
    rng = np.random.RandomState(7)
    theta, _ = pend.simulate_pendulum(rng, 5, 30)
    assert theta.shape == (5, 30)
    assert np.all(theta >= -np.pi) and np.all(theta < np.pi)

    replay = np.random.RandomState(7)
    theta0 = replay.uniform(0, 2 * np.pi, (5, 1))
    for _ in range(29):
        replay.normal(0, 0.1, 5)
    np.testing.assert_array_equal(theta[:, 0], theta0[:, 0] - np.pi)
    assert rng.random_sample() == replay.random_sample()


# --------------------------------------------------------------------------------------------
# §1.3 rendering


@pytest.mark.parametrize("theta", [0.0, 0.7, np.pi / 2, 2.0, -1.0, -2.9])
def test_rod_points_from_the_centre_towards_the_tip(theta):
    """θ = 0 hangs straight down; the image centroid lies along (sin θ, cos θ) (x=col, y=row)."""
    x1, y1 = pend.tip_pixel(np.array(theta))
    raw = pend.render_frame(int(x1), int(y1))
    assert raw.dtype == np.uint8 and raw.shape == (24, 24) and raw.max() == 255 and raw.min() == 0
    frame = raw.astype(np.float64)
    rows, cols = np.mgrid[0:24, 0:24] + 0.5
    dx = (frame * cols).sum() / frame.sum() - 12
    dy = (frame * rows).sum() / frame.sum() - 12
    assert np.hypot(dx, dy) > 3
    assert abs(np.angle(np.exp(1j * (np.arctan2(dx, dy) - theta)))) < 0.1


def test_frames_depend_only_on_the_truncated_tip_pixel():
    """Pillow truncates wide-line end points to whole pixels, which justifies the frame cache."""
    rng = np.random.RandomState(1)
    for x, y in rng.uniform(9, 119, (40, 2)):
        np.testing.assert_array_equal(pend.render_frame(x, y), pend.render_frame(int(x), int(y)))


def test_render_frames_matches_one_frame_at_a_time():
    theta = np.random.RandomState(2).uniform(-np.pi, np.pi, (3, 7))
    frames = pend.render_frames(theta)
    assert frames.shape == (3, 7, 24, 24) and frames.dtype == np.uint8
    x1, y1 = pend.tip_pixel(theta)
    for i, j in np.ndindex(3, 7):
        np.testing.assert_array_equal(frames[i, j], pend.render_frame(x1[i, j], y1[i, j]))


# --------------------------------------------------------------------------------------------
# §1.4 correlated observation noise


def test_noise_weights_follow_the_rescaled_clipped_walk():
    f = pend.noise_weights(np.random.RandomState(3), 500)
    assert f.shape == (500, 100)
    assert np.all(f[:, :5] == 1.0)
    assert f.min() == 0.0 and f.max() == 1.0
    # Walk steps are at most 0.2, rescaled by 1/(t2 − t1) ≤ 1/0.5 and then clipped.
    assert np.abs(np.diff(f[:, 5:], axis=1)).max() <= 0.4 + 1e-12
    assert 0.05 < np.mean(f[:, 5:] == 0.0) < 0.5 and 0.05 < np.mean(f[:, 5:] == 1.0) < 0.5


def test_mix_noise_keeps_clean_frames_and_truncates_pure_noise():
    rng = np.random.RandomState(4)
    frames = pend.render_frames(np.linspace(-3, 3, 100))[..., None]
    noise = pend.image_noise(rng)
    assert noise.shape == (100, 24, 24, 1)
    np.testing.assert_array_equal(pend.mix_noise(frames, np.ones(100), noise), frames)
    pure = pend.mix_noise(frames, np.zeros(100), noise)
    np.testing.assert_array_equal(pure, np.floor(noise).astype(np.uint8))
    assert pure.max() == 254 and abs(pure.mean() - 127.0) < 0.5


def test_split_sampling_is_clean_for_the_first_five_frames_and_reports_progress():
    messages = []
    data = pend.sample_pendulum_split(np.random.RandomState(5), 8, progress=messages.append)
    assert data["obs"].shape == (8, 100, 24, 24, 1) and data["obs"].dtype == np.uint8
    np.testing.assert_array_equal(data["obs"][:, :5], data["clean"][:, :5])
    assert not np.array_equal(data["obs"], data["clean"])
    np.testing.assert_allclose(np.hypot(*np.moveaxis(data["targets"], -1, 0)), 1.0)
    assert len(messages) == 4 and messages[-1].endswith("8/8 sequences")


# --------------------------------------------------------------------------------------------
# §1.7 sub-sampling and observation intervals


def test_observation_intervals_put_one_first_forward_and_last_backward():
    t = np.array([[0.0, 1, 2, 4, 5, 7], [3, 4, 8, 9, 10, 20]])
    np.testing.assert_array_equal(
        pend.observation_intervals(t), [[1, 1, 1, 2, 1, 2], [1, 1, 4, 1, 1, 10]]
    )
    np.testing.assert_array_equal(
        pend.observation_intervals(t, reverse=True), [[1, 1, 2, 1, 2, 1], [1, 4, 1, 1, 10, 1]]
    )


@pytest.mark.parametrize("split", ["train", "test", "valid"])
def test_subsample_indices_time_points(split):
    n = 2000 if split == "train" else 1000
    idx = pend.subsample_indices(n, SEED_OFFSET[split])
    assert idx.shape == (n, 50)
    assert np.all(np.diff(idx, axis=1) > 0) and idx.min() >= 0 and idx.max() <= 99
    assert int(idx.sum()) == SANITY[split][2]
    assert idx[0, :10].tolist() == SANITY[split][3]


# --------------------------------------------------------------------------------------------
# §1.10 reference checksums on the full data


@pytest.fixture(scope="module")
def generated():
    """All three splits, generated in the order of §1.6 (train, test: seed 42; valid: 43)."""
    rng42 = np.random.RandomState(42)
    return {
        "train": pend.sample_pendulum_split(rng42, 2000),
        "test": pend.sample_pendulum_split(rng42, 1000),
        "valid": pend.sample_pendulum_split(np.random.RandomState(43), 1000),
    }


@pytest.fixture(scope="module")
def prepared_root(tmp_path_factory):
    """A data root after `prepare_pendulum`, the prepared dataset, and the file's arrays."""
    root = tmp_path_factory.mktemp("data")
    dataset = pend.prepare_pendulum(root, progress=False)
    yield root, dataset, pend.load_pendulum_npz(root / "pendulum" / "pend_regression.npz")
    shutil.rmtree(root)  # 180 MB; pytest would otherwise keep it for three runs


@pytest.mark.parametrize("split", ["train", "test", "valid"])
def test_observations_and_targets_match_the_published_checksums(generated, split):
    obs_sum, md5, targets_sum, theta0, clean_sum = REFERENCE[split]
    data = generated[split]
    assert data["obs"].shape == (len(data["targets"]), 100, 24, 24, 1)
    assert int(data["clean"].sum(dtype=np.int64)) == clean_sum
    assert int(data["obs"].sum(dtype=np.int64)) == obs_sum
    assert pend.obs_md5(data["obs"]) == md5
    assert data["targets"].sum() == pytest.approx(targets_sum, abs=1e-9)
    assert np.arctan2(*data["targets"][0, 0]) == pytest.approx(theta0, abs=5e-7)


def test_first_train_targets_match_the_published_values(generated):
    expected = [
        [-0.709147024543, 0.705060633976],
        [-0.708403911007, 0.705807267510],
        [-0.706807994185, 0.707405441989],
    ]
    np.testing.assert_allclose(generated["train"]["targets"][0, :3], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("split", ["train", "test", "valid"])
def test_subsampled_data_match_the_s5_sanity_checksums(generated, split):
    obs_sum, targets_sum, _, _ = SANITY[split]
    data = generated[split]
    n = len(data["obs"])
    idx, rows = pend.subsample_indices(n, SEED_OFFSET[split]), np.arange(n)[:, None]
    assert (data["obs"][rows, idx] / 255.0).sum() == pytest.approx(obs_sum, abs=1e-6)
    assert data["targets"][rows, idx].sum() == pytest.approx(targets_sum, abs=1e-6)


def test_npz_file_has_the_published_layout(prepared_root, generated):
    root, _, arrays = prepared_root
    assert sorted(arrays) == sorted(
        [f"{s}_{k}" for s in ("train", "test", "valid") for k in ("obs", "targets", "ts")]
        + ["madeby"]
    )
    assert str(arrays["madeby"]) == "cru"
    for split, data in generated.items():
        np.testing.assert_array_equal(arrays[f"{split}_obs"], data["obs"])
        np.testing.assert_array_equal(arrays[f"{split}_targets"], data["targets"])
        ts = arrays[f"{split}_ts"]
        assert ts.dtype == np.float64 and ts.shape == data["targets"].shape[:2]
        np.testing.assert_allclose(ts, np.broadcast_to(np.arange(100.0), ts.shape), atol=1e-9)
        assert ts[0, -1] == 99.00000000000006
    folder = root / "pendulum"
    assert os.listdir(folder) == ["pend_regression.npz"]  # no temporary files left


def test_prepared_dataset_is_what_s5_feeds_the_model(prepared_root, generated):
    _, dataset, _ = prepared_root
    assert dataset.task == "regression" and set(dataset.splits) == {"train", "val", "test"}
    for name, key in (("train", "train"), ("val", "valid"), ("test", "test")):
        split, data = dataset.splits[name], generated[key]
        n = len(data["obs"])
        assert split.x.shape == (n, 50, 576) and split.x.dtype == np.float32
        assert split.y.shape == (n, 50, 2) and split.y.dtype == np.float32
        assert split.t.shape == (n, 50) and split.t.dtype == np.float32
        idx, rows = pend.subsample_indices(n, SEED_OFFSET[key]), np.arange(n)[:, None]
        np.testing.assert_array_equal(split.t, idx)
        frames = data["obs"][rows, idx].reshape(n, 50, 576)  # row-major pixels
        np.testing.assert_array_equal(split.x, (frames / 255.0).astype(np.float32))
        np.testing.assert_array_equal(split.y, data["targets"][rows, idx].astype(np.float32))
        assert split.x.min() >= 0.0 and split.x.max() <= 1.0


def test_prepare_reuses_the_checked_file(prepared_root, monkeypatch):
    root, first, _ = prepared_root
    path = root / "pendulum" / "pend_regression.npz"
    mtime = path.stat().st_mtime_ns

    def no_generation(*args, **kwargs):
        raise AssertionError("the existing file should have been reused")

    monkeypatch.setattr(pend, "generate_pendulum_npz", no_generation)
    again = pend.prepare_pendulum(root, progress=False, flatten=False)
    assert path.stat().st_mtime_ns == mtime
    assert again.splits["test"].x.shape == (1000, 50, 24, 24, 1)
    np.testing.assert_array_equal(again.splits["test"].x.reshape(1000, 50, 576),
                                  first.splits["test"].x)  # fmt: skip


def test_wrong_target_sums_are_rejected(prepared_root):
    _, _, arrays = prepared_root
    changed = dict(arrays, valid_targets=arrays["valid_targets"][::-1] * 0.5)
    with pytest.raises(DatasetError, match=r"x\.npz: valid_targets sum to 19101\.4"):
        pend.check_pendulum_arrays(changed, "x.npz")


# --------------------------------------------------------------------------------------------
# Corrupt files and atomic writes


def _file(root: Path) -> Path:
    path = root / "pendulum" / "pend_regression.npz"
    path.parent.mkdir(parents=True)
    return path


def test_garbage_file_is_a_dataset_error_naming_the_file(tmp_path):
    path = _file(tmp_path)
    path.write_bytes(b"not an npz" * 100)
    with pytest.raises(DatasetError, match=r"pend_regression\.npz is not an npz"):
        pend.prepare_pendulum(tmp_path, progress=False)


def test_damaged_member_is_a_dataset_error(tmp_path):
    path = _file(tmp_path)
    with zipfile.ZipFile(path, "w") as zf:  # a zip whose member is not an .npy array
        zf.writestr("train_obs.npy", b"\x93NUMPY garbage")
    with pytest.raises(DatasetError, match="could not be read as an npz"):
        pend.load_pendulum_npz(path)


def test_missing_key_and_wrong_shape_are_dataset_errors(tmp_path):
    path = _file(tmp_path)
    np.savez(path, train_obs=np.zeros((2, 100, 24, 24, 1), np.uint8))
    with pytest.raises(DatasetError, match=r"'train_obs' is uint8 \(2, 100, 24, 24, 1\)"):
        pend.load_pendulum_npz(path)
    np.savez(path, madeby=np.array("cru"))
    with pytest.raises(DatasetError, match=f"{path} has no array 'train_obs'"):
        pend.load_pendulum_npz(path)
    with pytest.raises(DatasetError, match="not found"):
        pend.load_pendulum_npz(tmp_path / "absent.npz")


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    small = {"train_obs": np.zeros((2, 3), np.uint8), "madeby": np.array("cru")}
    monkeypatch.setattr(pend, "_generate_arrays", lambda progress: small)

    def failing_save(file, **arrays):
        file.write(b"half of an npz")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", failing_save)
    target = tmp_path / "pendulum" / "pend_regression.npz"
    with pytest.raises(OSError, match="disk full"):
        pend.generate_pendulum_npz(target, progress=False)
    assert os.listdir(target.parent) == []


def test_atomic_dir_mode_follows_umask_and_failures_leave_nothing(tmp_path):
    from s5jax.data._common import atomic_dir

    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "a.txt").write_text("first")
        # a folder made by mkdir under the same umask: readable by others (not mkdtemp's 0700)
        assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755
        with pytest.raises(RuntimeError, match="boom"):
            with atomic_dir(tmp_path / "out") as tmp:
                (tmp / "a.txt").write_text("half")
                raise RuntimeError("boom")
        assert (tmp_path / "out" / "a.txt").read_text() == "first"  # left as it was
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "b.txt").write_text("second")
        assert sorted(os.listdir(tmp_path / "out")) == ["b.txt"]  # replaced whole
        assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary or old folder left
    finally:
        os.umask(old)
