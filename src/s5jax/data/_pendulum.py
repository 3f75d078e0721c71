"""Pendulum regression with irregular sampling (paper §6.3), reproduced bit for bit.

Lineage (`shared/specs/datasets.md` §1.1): the simulator and the correlated image noise come
from RKN (Becker et al. 2019); CRU (Schirmer et al. 2022) reused them with dt = 0.01 and 100
steps to make a regression task; the S5 authors' fork of CRU added a validation split drawn
with seed 43 and wrote `pend_regression.npz`, which S5 sub-samples to 50 of the 100 frames per
sequence. This module is written from that specification (not from the AGPL source) and
reproduces the published file exactly: legacy `np.random.RandomState` draws in the same
order, Pillow line drawing and Lanczos resize, and `np.random.default_rng` sub-sampling.

Notation: θ is the pendulum angle, ω its angular velocity, T = 100 frames per sequence,
N sequences per split, f the per-frame weight of the clean image in the noisy frame, and
τ_k the observation intervals of the sub-sampled frames.
"""

from __future__ import annotations

import hashlib
import time
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ._common import DatasetError, atomic_save_npz, data_root, log
from ._prepared import PreparedDataset, Split

__all__ = [
    "PENDULUM_FILENAME",
    "check_pendulum_arrays",
    "generate_pendulum_npz",
    "image_noise",
    "load_pendulum_npz",
    "mix_noise",
    "noise_weights",
    "obs_md5",
    "observation_intervals",
    "pendulum_substeps",
    "prepare_pendulum",
    "render_frame",
    "render_frames",
    "sample_pendulum_split",
    "simulate_pendulum",
    "subsample_indices",
    "tip_pixel",
]

PENDULUM_FILENAME = "pend_regression.npz"

# §1.2 physics (the regression task's friction and dt), §1.3 rendering, §1.4 noise.
N_STEPS = 100
DT = 0.01
SIM_DT = 1e-4
FRICTION = 0.1
GRAVITY = 9.81
MASS = 1.0
LENGTH = 1.0
TRANSITION_NOISE_STD = 0.1
OBSERVATION_NOISE_STD = 1e-5
IMG_SIZE = 24
_CANVAS = 128
_PIVOT = 64
_ROD_LENGTH = 55
_ROD_WIDTH = 8
FIRST_N_CLEAN = 5
_WALK_R = 0.2
_T1_RANGE = (0.0, 0.25)
_T2_RANGE = (0.75, 1.0)

# §1.6: (split in the npz, RandomState seed, N). Splits sharing a seed share one stream.
_GENERATION = (("train", 42, 2000), ("test", 42, 1000), ("valid", 43, 1000))
# §1.7: S5 keeps 50 of 100 frames; sequence i of a split uses default_rng(offset + i).
N_KEEP = 50
_SUBSAMPLE_SEED_OFFSET = {"train": 2000, "test": 0, "valid": 1000}
_PREPARED_NAME = {"train": "train", "valid": "val", "test": "test"}
# §1.10: sums of the (sin θ, cos θ) targets; they do not depend on the Pillow version.
REFERENCE_TARGET_SUMS = {
    "train": 74758.2303728470,
    "test": 37859.5143339897,
    "valid": 38202.8327826353,
}


# --------------------------------------------------------------------------------------------
# §1.2 Physics


def pendulum_substeps(
    theta: np.ndarray,
    omega: np.ndarray,
    *,
    dt: float = DT,
    sim_dt: float = SIM_DT,
    friction: float = FRICTION,
) -> tuple[np.ndarray, np.ndarray]:
    """Advance (θ, ω) by one observation step dt of semi-implicit Euler substeps of size sim_dt.

    θ = 0 is upright. With c = g·L·m/I and I = m·L²/3 each substep is
    ω ← ω + h·(c·sin θ − friction·ω), then θ ← θ + h·ω (the action is always 0).
    """
    inertia = MASS * LENGTH**2 / 3
    c = GRAVITY * LENGTH * MASS / inertia
    for _ in range(int(dt / sim_dt)):
        omega = omega + sim_dt * (c * np.sin(theta) - friction * omega)
        theta = theta + sim_dt * omega
    return theta, omega


def simulate_pendulum(
    rng: np.random.RandomState,
    n: int,
    n_steps: int = N_STEPS,
    *,
    dt: float = DT,
    friction: float = FRICTION,
    transition_noise_std: float = TRANSITION_NOISE_STD,
    sim_dt: float = SIM_DT,
) -> tuple[np.ndarray, np.ndarray]:
    """Simulate n pendulums for n_steps frames; returns (θ, ω), each (n, n_steps) float64.

    θ₀ ~ U[0, 2π), ω₀ = 0. After each step ω gets N(0, transition_noise_std²) noise and θ is
    wrapped to [0, 2π). Angles are returned shifted by −π (0 = hanging down, θ ∈ [−π, π)).
    Draws from `rng`: one `uniform` of shape (n, 1), then one `normal` of size n per step.
    """
    theta = np.zeros((n, n_steps))
    omega = np.zeros((n, n_steps))
    theta[:, 0] = rng.uniform(0, 2 * np.pi, (n, 1))[:, 0]
    for k in range(1, n_steps):
        th, om = pendulum_substeps(
            theta[:, k - 1], omega[:, k - 1], dt=dt, sim_dt=sim_dt, friction=friction
        )
        if transition_noise_std > 0:
            om = om + rng.normal(0.0, transition_noise_std, n)
        theta[:, k] = th % (2 * np.pi)
        omega[:, k] = om
    return theta - np.pi, omega


def _time_stamps(n: int, n_steps: int, dt: float) -> np.ndarray:
    """`*_ts` of the npz: t/dt with t accumulated by repeated += dt (so 99.00000000000006)."""
    t = np.cumsum(np.r_[0.0, np.full(n_steps - 1, dt)]) / dt
    return np.broadcast_to(t, (n, n_steps)).copy()


# --------------------------------------------------------------------------------------------
# §1.3 Rendering


def tip_pixel(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer rod-tip pixel (x1, y1) = trunc(64 + 55·sin θ, 64 + 55·cos θ) for angles θ.

    Pillow truncates the end points of a wide line to whole pixels before drawing, so the
    frame depends on θ only through this pixel; frames are cached by it.
    """
    x1 = np.sin(theta) * _ROD_LENGTH + _PIVOT
    y1 = np.cos(theta) * _ROD_LENGTH + _PIVOT
    return x1.astype(np.int64), y1.astype(np.int64)


def render_frame(x1: float, y1: float) -> np.ndarray:
    """Draw the rod from the pivot (64, 64) to (x1, y1) and return the (24, 24) uint8 frame.

    A 128×128 float canvas, a line of width 8 and value 1.0, a Lanczos resize to 24×24,
    clip to [0, 1], times 255 in float32, truncated to uint8.
    """
    img = Image.new("F", (_CANVAS, _CANVAS), 0.0)
    ImageDraw.Draw(img).line([_PIVOT, _PIVOT, x1, y1], fill=1.0, width=_ROD_WIDTH)
    img = img.resize((IMG_SIZE, IMG_SIZE), resample=Image.Resampling.LANCZOS)
    frame = np.clip(np.asarray(img), 0, 1)
    return (np.float32(255.0) * frame).astype(np.uint8)


def render_frames(theta: np.ndarray) -> np.ndarray:
    """Clean frames for angles θ of any shape S: uint8 of shape S + (24, 24)."""
    x1, y1 = tip_pixel(theta)
    keys, inverse = np.unique(x1 * _CANVAS + y1, return_inverse=True)
    table = np.stack([render_frame(int(k // _CANVAS), int(k % _CANVAS)) for k in keys])
    return table[inverse.reshape(theta.shape)]


# --------------------------------------------------------------------------------------------
# §1.4 Correlated observation noise


def noise_weights(rng: np.random.RandomState, n: int, n_steps: int = N_STEPS) -> np.ndarray:
    """Per-frame clean-image weights f, shape (n, n_steps), of the RKN noise process.

    f is a random walk clipped to [0, 1] with U(−0.2, 0.2) increments, rescaled per sequence
    by f ← clip((f − t1)/(t2 − t1), 0, 1) with t1 ~ U(0, 0.25), t2 ~ U(0.75, 1); the first 5
    frames are clean (f = 1).
    """
    f = np.zeros((n, n_steps))
    f[:, 0] = rng.uniform(0.0, 1.0, n)
    for k in range(n_steps - 1):
        f[:, k + 1] = np.clip(f[:, k] + rng.uniform(-_WALK_R, _WALK_R, n), 0.0, 1.0)
    t1 = rng.uniform(*_T1_RANGE, (n, 1))
    t2 = rng.uniform(*_T2_RANGE, (n, 1))
    f = np.clip((f - t1) / (t2 - t1), 0.0, 1.0)
    f[:, :FIRST_N_CLEAN] = 1.0
    return f


def image_noise(rng: np.random.RandomState, n_steps: int = N_STEPS) -> np.ndarray:
    """One sequence's pixel noise: `uniform(0, 255, (n_steps, 24, 24, 1))` from `rng`."""
    return rng.uniform(0.0, 255, (n_steps, IMG_SIZE, IMG_SIZE, 1))


def mix_noise(frames: np.ndarray, f: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """One sequence's noisy frames uint8(f·img + (1 − f)·noise), truncated.

    `frames` is (T, 24, 24, 1) uint8, `f` is (T,) and `noise` has the frames' shape.
    """
    w = f[:, None, None, None]
    return (w * frames + (1 - w) * noise).astype(np.uint8)


# --------------------------------------------------------------------------------------------
# §1.5–1.6 One split, the RNG call order, and the npz file

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _stderr(message: str) -> None:
    """Progress of the generation, logged (logger `s5jax.data`; shown by the `s5jax`
    command unless `-q`)."""
    log.info("%s", message)


def sample_pendulum_split(
    rng: np.random.RandomState,
    n: int,
    *,
    n_steps: int = N_STEPS,
    progress: Progress = _quiet,
    label: str = "split",
) -> dict[str, np.ndarray]:
    """Generate one split of n sequences of T frames, drawing from `rng` in the order of §1.5.

    Returns `obs` uint8 (n, T, 24, 24, 1) (noisy frames), `targets` float64 (n, T, 2) =
    (sin θ, cos θ) of the noise-free angle, `ts` float64 (n, T) and `clean` (the frames
    before image noise, drawn from the angle plus N(0, 1e-5²) state noise).
    Draws: θ₀, T−1 transition-noise vectors, the (n, T, 2) state noise, the noise weights
    f, then one pixel-noise array per sequence.
    """
    theta, _ = simulate_pendulum(rng, n, n_steps)
    state_noise = rng.normal(0.0, OBSERVATION_NOISE_STD, (n, n_steps, 2))
    clean = render_frames(theta + state_noise[..., 0])[..., None]
    f = noise_weights(rng, n, n_steps)
    obs = np.empty_like(clean)
    step = max(1, n // 4)
    for i in range(n):
        obs[i] = mix_noise(clean[i], f[i], image_noise(rng, n_steps))
        if (i + 1) % step == 0 or i + 1 == n:
            progress(f"pendulum: {label} {i + 1}/{n} sequences")
    targets = np.stack([np.sin(theta), np.cos(theta)], axis=-1)
    return {"obs": obs, "targets": targets, "ts": _time_stamps(n, n_steps, DT), "clean": clean}


def _generate_arrays(progress: Progress) -> dict[str, np.ndarray]:
    """All splits in the order of §1.6 (train then test from seed 42, valid from seed 43)."""
    arrays: dict[str, np.ndarray] = {}
    streams: dict[int, np.random.RandomState] = {}
    for split, seed, n in _GENERATION:
        rng = streams.setdefault(seed, np.random.RandomState(seed))
        start = time.perf_counter()
        data = sample_pendulum_split(rng, n, progress=progress, label=f"{split} (seed {seed})")
        for key in ("obs", "targets", "ts"):
            arrays[f"{split}_{key}"] = data[key]
        progress(f"pendulum: {split} done in {time.perf_counter() - start:.1f} s")
    arrays["madeby"] = np.array("cru")
    return arrays


def generate_pendulum_npz(path: str | Path, *, progress: bool = True) -> Path:
    """Generate `pend_regression.npz` at `path` (written atomically); returns the path.

    Keys: `{train,test,valid}_obs` uint8 (N, 100, 24, 24, 1), `_targets` float64 (N, 100, 2)
    = (sin θ, cos θ), `_ts` float64 (N, 100), and `madeby` = 'cru'; N = 2000/1000/1000.
    """
    path = Path(path)
    arrays = _generate_arrays(_stderr if progress else _quiet)
    atomic_save_npz(path, compressed=True, **arrays)
    return path


def _expected_layout() -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    layout = {}
    for split, _, n in _GENERATION:
        layout[f"{split}_obs"] = (np.dtype(np.uint8), (n, N_STEPS, IMG_SIZE, IMG_SIZE, 1))
        layout[f"{split}_targets"] = (np.dtype(np.float64), (n, N_STEPS, 2))
        layout[f"{split}_ts"] = (np.dtype(np.float64), (n, N_STEPS))
    return layout


def load_pendulum_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Load and check `pend_regression.npz`: keys, dtypes, shapes and the target sums.

    Raises `DatasetError` naming the file when it is unreadable or not the reference data.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path} not found; run `prepare_pendulum` to generate it")
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"{path} is not an npz (zip) file; {_regenerate(path)}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise DatasetError(
            f"{path} could not be read as an npz file ({err}); {_regenerate(path)}"
        ) from err
    check_pendulum_arrays(arrays, path)
    return arrays


def _regenerate(path: Path) -> str:
    return f"delete {path} and prepare the dataset again to regenerate it"


def check_pendulum_arrays(arrays: dict[str, np.ndarray], path: str | Path) -> None:
    """Raise `DatasetError` naming `path` unless `arrays` have the layout and target sums of §1.

    The target sums do not depend on the Pillow version, so they identify the reference data.
    """
    path = Path(path)
    for key, (dtype, shape) in _expected_layout().items():
        if key not in arrays:
            raise DatasetError(
                f"{path} has no array {key!r} (keys: {sorted(arrays)}); {_regenerate(path)}"
            )
        arr = arrays[key]
        if arr.dtype != dtype or arr.shape != shape:
            raise DatasetError(
                f"{path}: {key!r} is {arr.dtype} {arr.shape}, expected {dtype} {shape}; "
                + _regenerate(path)
            )
    for split, ref in REFERENCE_TARGET_SUMS.items():
        total = float(arrays[f"{split}_targets"].sum())
        if not np.isclose(total, ref, rtol=0, atol=1e-6):
            raise DatasetError(
                f"{path}: {split}_targets sum to {total!r}, not the reference {ref!r}; "
                + _regenerate(path)
            )


def obs_md5(obs: np.ndarray) -> str:
    """md5 of a uint8 observation array's bytes, as quoted in §1.10."""
    return hashlib.md5(np.ascontiguousarray(obs).tobytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# §1.7 Irregular sub-sampling and observation intervals


def subsample_indices(
    n: int, seed_offset: int, *, n_steps: int = N_STEPS, n_keep: int = N_KEEP
) -> np.ndarray:
    """Kept frame indices, (n, n_keep) int64, sorted: sequence i uses default_rng(offset + i).

    `seed_offset` is 2000 for train, 0 for test and 1000 for valid (random_state = 0).
    """
    rows = [
        np.sort(np.random.default_rng(seed_offset + i).choice(n_steps, n_keep, replace=False))
        for i in range(n)
    ]
    return np.stack(rows).astype(np.int64)


def observation_intervals(t: np.ndarray, *, reverse: bool = False) -> np.ndarray:
    """Per-step Δ multipliers from observation times t (..., L): forward [1, τ_1, …, τ_{L−1}].

    τ = diff(t) along the last axis. With `reverse=True` (the backward pass of a
    bidirectional SSM) the multipliers are [τ_1, …, τ_{L−1}, 1].
    """
    t = np.asarray(t)
    tau = np.diff(t, axis=-1)
    one = np.ones((*t.shape[:-1], 1), dtype=tau.dtype)
    return np.concatenate([tau, one] if reverse else [one, tau], axis=-1)


def _subsampled_split(arrays: dict[str, np.ndarray], split: str, flatten: bool) -> Split:
    obs = arrays[f"{split}_obs"]
    n = len(obs)
    idx = subsample_indices(n, _SUBSAMPLE_SEED_OFFSET[split])
    rows = np.arange(n)[:, None]
    x = (obs[rows, idx] / 255.0).astype(np.float32)
    if flatten:
        x = x.reshape(n, N_KEEP, IMG_SIZE * IMG_SIZE)
    y = arrays[f"{split}_targets"][rows, idx].astype(np.float32)
    return Split(x=x, y=y, t=idx.astype(np.float32))


def prepare_pendulum(
    root: str | Path | None = None, *, progress: bool = True, flatten: bool = True
) -> PreparedDataset:
    """The S5 pendulum regression data: generate `<root>/pendulum/pend_regression.npz` if absent.

    An existing file is checked and reused. Each sequence keeps 50 of its 100 frames (§1.7):
    `x` is pixels / 255 as float32, (N, 50, 576) row-major (or (N, 50, 24, 24, 1) with
    `flatten=False`); `y` the (sin θ, cos θ) targets, float32 (N, 50, 2); `t` the kept frame
    indices as float32 (N, 50). Splits are `train` (2000), `val` (1000, seed 43), `test` (1000).
    Turn `t` into step multipliers with `observation_intervals`.

    **Arguments:**
    - `root`: the data root (default `data_root()`); the file lives in `<root>/pendulum/`.
    - `progress`: print generation progress to stderr.
    - `flatten`: give frames as 576 row-major pixels (S5's IN_DIM) rather than 24×24×1.
    """
    root = data_root() if root is None else Path(root).expanduser()
    path = root / "pendulum" / PENDULUM_FILENAME
    if not path.exists():
        if progress:
            _stderr(f"pendulum: generating {path} (takes a few seconds)")
        generate_pendulum_npz(path, progress=progress)
    arrays = load_pendulum_npz(path)
    splits = {name: _subsampled_split(arrays, key, flatten) for key, name in _PREPARED_NAME.items()}
    meta = {
        "source": str(path),
        "frame_shape": [IMG_SIZE, IMG_SIZE, 1],
        "n_steps": N_STEPS,
        "n_keep": N_KEEP,
        "dt": DT,
        "t_unit": "frame index (one frame = dt seconds)",
        "target_names": ["sin_theta", "cos_theta"],
    }
    return PreparedDataset(name="pendulum", task="regression", splits=splits, meta=meta)
