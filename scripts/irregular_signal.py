"""Irregularly sampled noisy signals with per-step targets, with their times in seconds,
milliseconds and hours: data for checking that the settings `s5jax train --data` chooses do not
depend on the unit of the observation times (`docs/results.md`, "Observation times in any
unit").

Each example is a sum of three sinusoids (periods 1-5 s, amplitudes 0.5-1, random phases)
observed at 80 times with exponential gaps of mean 0.25 s, plus Gaussian noise of standard
deviation 0.8; the target at each step is the noiseless signal (causal denoising). 600 train,
200 val and 200 test examples, the same in the three files except for the unit of `t_*`.

    .venv/bin/python scripts/irregular_signal.py OUT_DIR   # sig_s.npz, sig_ms.npz, sig_h.npz
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

UNITS = {"s": lambda t: t, "ms": lambda t: t * 1000.0, "h": lambda t: t / 3600}


def make(rng: np.random.Generator, n: int, length: int = 80):
    t = np.cumsum(rng.exponential(0.25, (n, length)), axis=1)
    t -= t[:, :1]
    s = np.zeros((n, length))
    for _ in range(3):
        period = rng.uniform(1, 5, (n, 1))
        phase = rng.uniform(0, 2 * np.pi, (n, 1))
        amplitude = rng.uniform(0.5, 1, (n, 1))
        s += amplitude * np.sin(2 * np.pi * t / period + phase)
    x = s + 0.8 * rng.standard_normal((n, length))
    return x[..., None].astype(np.float32), s[..., None].astype(np.float32), t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for sig_s.npz, sig_ms.npz, sig_h.npz")
    parser.add_argument("--seed", type=int, default=1, help="the generator's seed (default 1)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    splits = {name: make(rng, n) for name, n in (("train", 600), ("val", 200), ("test", 200))}
    args.out.mkdir(parents=True, exist_ok=True)
    for unit, convert in UNITS.items():
        arrays = {}
        for name, (x, y, t) in splits.items():
            arrays |= {f"x_{name}": x, f"y_{name}": y, f"t_{name}": convert(t)}
        np.savez(args.out / f"sig_{unit}.npz", **arrays)
        print(args.out / f"sig_{unit}.npz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
