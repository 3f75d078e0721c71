"""A seeded Pathfinder / Path-X generator: the Linsley et al. algorithm in numpy, no cv2/scipy.

Spec: `datasets.md` §0 and §2.2 (generator summary). The original is `snakes2.py` and
`snakes.py` of `drewlinsley/pathfinder`, run by `snakes2_wrapper.py` with the settings listed in
the docstrings of LRA's `lra_benchmarks/data/pathfinder.py`. This module re-implements that
algorithm (it shares no code with it) and writes the result laid out like the LRA release, so
`prepare_pathfinder(<target>, resolution=R)` reads it unchanged:

    <target>/pathfinder{R}/curv_contour_length_14/imgs/<batch>/sample_<k>.png   8-bit grayscale
    <target>/pathfinder{R}/curv_contour_length_14/metadata/<batch>.npy          text, one line
    <target>/pathfinder{R}/curv_contour_length_14/generator.json                our provenance

A metadata line holds the original generator's fields (`snakes2.py: accumulate_meta`):
`imgs/<batch> sample_<k>.png <k> <label> <continuity> <contour_length> <distractor_length>
<paddle_length> <paddle_thickness> <paddle_margin> <n_paddle_contrasts>`. `generator.json`
records `"generated": true`, the seed and every parameter: data made here is synthetic, and
numbers trained on it are not comparable with published LRA results.

The algorithm (per image; R the resolution, L the paddle length):

1. Draw the paddle margin m from the margin list.
2. Two target paths ("snakes"). The first starts with a paddle at a uniform integer-degree
   orientation whose tail T and head lie in the central box `[2·seed_distance, R −
   2·seed_distance)²`; the second starts `seed_distance` px from T in a uniform integer-degree
   direction. Then each is extended in turn, `contour_length − 1` times: the next pivot lies
   `L + 2m` beyond the last pivot along the last orientation (rounded up, as the original's
   `translate_coord`); the candidate heads are the distinct pixels on the circle of radius
   `L + m` around it; each is weighted by `max(cos(min(|Δangle|·continuity, π/2)), 0)²` times
   "free" (not within the clearance of another paddle) and one is drawn; the paddle runs from
   that head L px back towards the pivot. A paddle that does not fit (below) is redrawn, up to
   `max_paddle_retrial + 1` draws; then the pair fails and is started again from scratch, as
   `two_snakes` does (at most `max_target_attempts` times, then an error).
3. `num_distractor_snakes` distractor paths of `distractor_length` paddles, each seeded at a
   tail drawn uniformly among those where its first paddle fits and grown the same way; a
   failed distractor is retried `max_distractor_contour_retrial` times, then skipped; none is
   started once fewer than `stop_with_availability` of the pixels are free.
4. Markers: discs of `marker_radius` at the start tail of one target (chosen at random) and at
   the far end of the same target (label 1) or of the other one (label 0).

Consecutive paddles of a path are about 2m px apart, so paths are dashed, as in the release.
A path "owns" its trace: its paddles, the thin joins from each paddle's head to the next
paddle's start, and for the targets the marker discs at both ends. A paddle fits when its trace
stays in the image less `padding + m − 1` px at each border and more than 2m − 1 px (and never
8-adjacent) from the traces of other paths and of its own path's older paddles; its own previous
paddle does not count, as in `extend_snake`. (Joins keep 1 px: their gap is already within the
clearance of its two ends.) So the traces of different paths are never 8-adjacent, while each
path's trace is 8-connected: a flood fill over the traces finds exactly one component per path.

Differences from the original (choices made here, see `PathfinderParams`): lines are drawn at
the final resolution without anti-aliasing (the original draws at 2× and resamples with
Lanczos); collisions are exact pixel tests where the original thresholds a sum of resampled soft
masks at 1.8; the marker discs at the targets' four ends are reserved, so a marker never touches
another path; the first target's last paddle counts as an obstacle for the distractors (the
original forgets it in `two_snakes`); restarts of the target pair are bounded; labels are
exactly balanced (the original draws each independently); and the random stream is one numpy
`Generator` (the original mixes the unseeded global numpy and `random` states), so no image can
equal the release's. The target pair is accepted rarely (about 1.5 % of attempts at R = 32,
0.08 % and 0.4 % at R = 128 for m = 3 and 2; the original, which simply loops, should be about
as selective), so attempts run as vectorised batches and every accepted pair is kept for later
images of the same margin.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ._common import (
    GENERATED_FILE,
    DatasetError,
    atomic_dir,
    atomic_write_bytes,
    atomic_write_text,
)
from ._vocab import Progress

__all__ = [
    "PathfinderParams",
    "PathfinderSample",
    "generate_pathfinder",
    "lra_pathfinder_params",
    "sample_pathfinder_image",
]

_GENERATOR = "s5jax.pathfinder_gen/1"
_PROVENANCE = GENERATED_FILE
RESOLUTIONS = (32, 128)


@dataclass(frozen=True)
class PathfinderParams:
    """The generator's parameters; `lra_pathfinder_params(R)` gives LRA's for R = 32 or 128.

    From LRA (`lra_benchmarks/data/pathfinder.py`, docstrings of `Pathfinder32` and
    `Pathfinder128`, listing what was changed in `drewlinsley/pathfinder: snakes2_wrapper.py`):
    - `resolution`: `window_size`, 32 (Pathfinder) or 128 (Path-X).
    - `contour_length`: 14 paddles per target path (the hard difficulty,
      `curv_contour_length_14`, the only one S4/S5 use).
    - `distractor_length`: `contour_length // 3` = 4. At 128 LRA writes `14 / 3`, which must
      have been Python 2 integer division (a float would fail in the generator's `range`).
    - `num_distractor_snakes`: `20 // 4` = 5 at 32; `35 / 4` = 8 at 128 (same inference).
      (The wrapper script computes this once before its loop over contour lengths; were that
      done, the values would be `20 // 2` = 10 and `35 / 2` = 17.)
    - `paddle_margins`: `paddle_margin_list`, (1,) at 32 and (2, 3) at 128, drawn per image.
    - `paddle_thickness`: 0.5 at 32, 1.5 at 128 (recorded; see `line_half_width`).
    - `padding`: 1 (a ring of the image border kept free of paths).
    - `seed_distance`: 7 at 32, 20 at 128 (distance between the two targets' start tails).
    - `marker_radius`: 1.5 at 32, 3 at 128.
    - `continuity`: 1.0 at 32, 1.8 at 128 (larger: straighter paths).
    - `snake_contrast`, `paddle_contrast`: 2 and 0.75 at 32; 0.9 and 1 (the `Args` default,
      not customised) at 128. Here they set the path intensity, see `path_value`.
    - `antialias_scale`: 2 (recorded only; nothing is anti-aliased here).

    From the generator itself (`snakes2_wrapper.py: Args` defaults, `snakes2.py`):
    - `paddle_length`: 2 at 32 (LRA), 5 at 128 (the `Args` default, not customised by LRA).
    - `max_paddle_retrial`: 2 (a paddle is drawn at most 3 times before its path fails).
    - `max_distractor_contour_retrial`: 4.
    - `stop_with_availability`: 0.01 (no new distractor when < 1 % of the pixels are free).
    - Single-paddle distractors are not generated (`use_single_paddles = False` in the wrapper).

    Our choices:
    - `line_half_width`: 0.5 at 32: thin 8-connected 1 px lines (points every 1/4 px rounded
      to the nearest pixel); 0.75 at 128: the pixels within 0.75 px of the segment (1–2 px
      lines). These stand for the original's 0.5 and 1.5 px paddles blurred by Lanczos
      resampling. Allowed: <= 0.5 (thin) or >= √(1/2), so that every path is 8-connected.
    - `path_value`: the uint8 intensity of paths, `255 · min(1, snake_contrast ·
      paddle_contrast)` (255 at 32, 230 at 128); `marker_value`: 255 (the original
      byte-scales max(paths, markers) to 0–255).
    - `max_target_attempts`: 20,000 attempts at the target pair per image before giving up
      with an error (the original retries forever; about 1 in 1,250 attempts succeeds at the
      hardest setting, R = 128 with m = 3).
    - `images_per_batch`: 1000 images per `imgs/<batch>/` folder and metadata file.
    - Fixed in the code: the clearance between traces of different paths is 2m − 1 px and at
      least one empty pixel (the original's soft masks, dilated by m at 2× and thresholded at
      1.8, give about the same separation at R = 128 and slightly less at R = 32); traces stay
      `padding + m − 1` px inside the image; the central box constrains only the tail and head
      of the first target's first paddle (the original's test there uses a mask that its
      uint8 cast reduces to the paddle's core).
    """

    resolution: int
    paddle_length: int
    paddle_thickness: float
    paddle_margins: tuple[int, ...]
    continuity: float
    seed_distance: int
    marker_radius: float
    snake_contrast: float
    paddle_contrast: float
    num_distractor_snakes: int
    line_half_width: float
    contour_length: int = 14
    distractor_length: int = 4
    padding: int = 1
    antialias_scale: int = 2
    max_paddle_retrial: int = 2
    max_distractor_contour_retrial: int = 4
    stop_with_availability: float = 0.01
    marker_value: int = 255
    max_target_attempts: int = 20_000
    images_per_batch: int = 1000
    difficulty: str = "curv_contour_length_14"

    def __post_init__(self):
        if self.resolution < 8:
            raise ValueError(f"resolution must be at least 8, got {self.resolution}")
        if not self.paddle_margins or min(self.paddle_margins) < 1:
            raise ValueError(f"paddle_margins must be integers >= 1, got {self.paddle_margins}")
        if 0.5 < self.line_half_width < math.sqrt(0.5) or self.line_half_width <= 0:
            raise ValueError(
                f"line_half_width must be in (0, 0.5] or >= sqrt(1/2), got {self.line_half_width}"
            )
        if self.contour_length < 2 or self.distractor_length < 1 or self.paddle_length < 1:
            raise ValueError("need contour_length >= 2, distractor_length >= 1, paddle_length >= 1")
        if self.max_target_attempts < 1 or self.images_per_batch < 1:
            raise ValueError("max_target_attempts and images_per_batch must be >= 1")

    @property
    def path_value(self) -> int:
        """The uint8 intensity of path pixels."""
        return round(255 * min(1.0, self.snake_contrast * self.paddle_contrast))


def lra_pathfinder_params(resolution: int) -> PathfinderParams:
    """LRA's settings for Pathfinder (`resolution=32`) or Path-X (`resolution=128`)."""
    if resolution == 32:
        return PathfinderParams(
            resolution=32,
            paddle_length=2,
            paddle_thickness=0.5,
            paddle_margins=(1,),
            continuity=1.0,
            seed_distance=7,
            marker_radius=1.5,
            snake_contrast=2.0,
            paddle_contrast=0.75,
            num_distractor_snakes=5,
            line_half_width=0.5,
        )
    if resolution == 128:
        return PathfinderParams(
            resolution=128,
            paddle_length=5,
            paddle_thickness=1.5,
            paddle_margins=(2, 3),
            continuity=1.8,
            seed_distance=20,
            marker_radius=3.0,
            snake_contrast=0.9,
            paddle_contrast=1.0,
            num_distractor_snakes=8,
            line_half_width=0.75,
        )
    raise ValueError(f"resolution must be 32 (Pathfinder) or 128 (Path-X), got {resolution!r}")


@dataclass(frozen=True)
class PathfinderSample:
    """One generated image and what is known about it.

    - `image`: (R, R) uint8, what is written to the PNG.
    - `paths`: (R, R) int16, the trace of each path (0 background, 1 and 2 the targets,
      3… the distractors), markers included; every drawn pixel lies on a trace.
    - `markers`: the two marker centres ((y, x), (y, x)).
    - `label`: 1 when both markers sit on the same path, else 0.
    - `margin`: the paddle margin drawn for this image.
    """

    image: np.ndarray
    paths: np.ndarray
    markers: tuple[tuple[int, int], tuple[int, int]]
    label: int
    margin: int


# ---------------------------------------------------------------------------------------
# Geometry: pixel sets of segments and discs, and the stamps of paddles


def _disc(radius: float) -> np.ndarray:
    """Offsets (K, 2) with dy² + dx² <= radius² (the original's `generate_dilation_struct`)."""
    r = math.floor(radius)
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
    keep = dy**2 + dx**2 <= radius**2 + 1e-9
    return np.stack([dy[keep], dx[keep]], axis=1).astype(np.int64)


def _segment(a, b, w: float) -> np.ndarray:
    """Pixels (N, 2) of the segment a-b: thin (w <= 0.5) or all within `w` of it (w >= 0.71).

    Thin: points every 1/4 px along the segment, rounded to the nearest pixel; consecutive
    points round to 8-adjacent pixels, so the line is 8-connected. Wide: with w >= sqrt(1/2)
    every point of the segment has a pixel centre within w, so the band is 8-connected too.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if w <= 0.5:
        n = math.ceil(4 * float(np.hypot(*(b - a)))) + 1
        t = np.linspace(0.0, 1.0, n)[:, None]
        return np.unique(np.rint(a + t * (b - a)).astype(np.int64), axis=0)
    y0, x0 = np.floor(np.minimum(a, b) - w).astype(np.int64)
    y1, x1 = np.ceil(np.maximum(a, b) + w).astype(np.int64)
    yy, xx = np.mgrid[y0 : y1 + 1, x0 : x1 + 1].astype(np.float64)
    (ay, ax), (vy, vx) = a, b - a
    n2 = vy * vy + vx * vx
    t = np.clip(((yy - ay) * vy + (xx - ax) * vx) / n2, 0.0, 1.0) if n2 > 0 else 0.0
    iy, ix = np.nonzero((yy - ay - t * vy) ** 2 + (xx - ax - t * vx) ** 2 <= w * w + 1e-9)
    return np.stack([iy + y0, ix + x0], axis=1)


def _pixels(segments, discs, w: float) -> np.ndarray:
    """Union of the pixels of `segments` (a, b) drawn `w` wide and of `discs` (centre, r)."""
    parts = [_segment(a, b, w) for a, b in segments]
    parts += [_disc(r) + np.asarray(c, np.int64) for c, r in discs]
    return np.unique(np.concatenate(parts), axis=0)


@dataclass(frozen=True)
class _Stamp:
    """A paddle relative to an integer origin: `trace` (the pixels its path owns: the paddle
    and any marker disc), `drawn` (the pixels drawn), and the flat offsets of the trace and of
    the probe (the trace dilated by the clearance) on the padded canvas."""

    trace: np.ndarray
    drawn: np.ndarray
    trace_f: np.ndarray
    probe_f: np.ndarray


def _padded(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged 1-D int arrays as one (n, longest) array (zeros past each end) and its mask."""
    longest = max(len(r) for r in rows)
    out = np.zeros((len(rows), longest), dtype=np.int64)
    mask = np.zeros((len(rows), longest), dtype=bool)
    for k, row in enumerate(rows):
        out[k, : len(row)], mask[k, : len(row)] = row, True
    return out, mask


class _Geometry:
    """Everything about paddles for one margin m on a padded canvas of width `width`.

    Orientations are indexed: 0..359 are the seeds' integer degrees −180..179, 360 + i the
    direction of candidate head i. A path's next pivot, and the bridge from its last head to
    its next paddle, depend only on its current orientation index, so they are tabulated.
    """

    def __init__(self, params: PathfinderParams, margin: int, width: int):
        p = self.p = params
        self.m, self.width = margin, width
        # clearance: the traces of different paths stay more than 2m - 1 px apart and are never
        # 8-adjacent (the original compares paddles dilated by m, with soft edges)
        square = np.stack(np.meshgrid([-1, 0, 1], [-1, 0, 1]), axis=-1).reshape(-1, 2)
        self.struct = np.unique(np.concatenate([_disc(2 * margin - 1), square]), axis=0)
        self.struct_f = self.flat(self.struct)
        # the joins between paddles (bridges) keep only the 1 px clearance that rules out
        # 8-adjacency: the gap of a join is already within the full clearance of its two ends
        self.square_f = self.flat(square)
        self.marker = _disc(p.marker_radius)
        length, radius = p.paddle_length, p.paddle_length + margin
        # candidate heads: the distinct pixels on a circle of radius L + m around the pivot,
        # one sample per pixel of arc, truncated as the original does (`get_coords_cmf`)
        step = 360.0 / (2 * radius * math.pi)
        phi = np.deg2rad(np.arange(0.0, 360.0, step))
        offs = np.floor(radius * np.stack([np.sin(phi), np.cos(phi)], axis=1)).astype(np.int64)
        self.cand = np.unique(offs, axis=0)
        self.cand_f = self.flat(self.cand)
        cand_theta = np.arctan2(self.cand[:, 0], self.cand[:, 1])
        n_cand = len(self.cand)
        self.theta = np.concatenate([np.deg2rad(np.arange(-180, 180)), cand_theta])
        unit = np.stack([np.sin(self.theta), np.cos(self.theta)], axis=1)
        # `max(cos(min(|Δangle|·continuity, π/2)), 0)²` (`get_coords_cmf`), per orientation
        delta = np.abs(cand_theta[None, :] - self.theta[:, None])
        delta = np.minimum(delta, 2 * np.pi - delta)
        self.weights = np.cos(np.minimum(delta * p.continuity, np.pi / 2)) ** 2
        # the next pivot is L + 2m beyond the last one, rounded up (`translate_coord`)
        self.advance = np.ceil((length + 2 * margin) * unit).astype(np.int64)
        # seeds (`seed_snake`): head = ceil(tail + L·u), pivot = ceil(head − (L + m)·u)
        seed_unit = unit[:360]
        self.seed_head = np.ceil(length * seed_unit).astype(np.int64)
        self.seed_pivot = np.ceil(self.seed_head - (length + margin) * seed_unit).astype(np.int64)
        # paddle i runs from its head L px back towards the pivot (`extend_snake`)
        self.start = self.cand - length * unit[360:]
        # the previous head relative to the next pivot, per orientation index
        back = np.concatenate([self.seed_head - self.seed_pivot, self.cand]) - self.advance
        # bridges: thin segments from that head to the start of each candidate paddle,
        # sampled every 1/4 px or closer and rounded (8-connected); repeats are harmless
        gap = float(np.max(np.hypot(*(back[:, None, :] - self.start[None, :, :]).T)))
        t = np.linspace(0.0, 1.0, math.ceil(4 * gap) + 2)[None, None, :, None]
        a, b = back[:, None, None, :].astype(np.float64), self.start[None, :, None, :]
        points = np.rint(a + t * (b - a)).astype(np.int64)  # (n_theta, C, n, 2)
        # keep each pixel once (repeats are consecutive), first in each row, padded by repeats
        new = np.ones(points.shape[:3], dtype=bool)
        new[:, :, 1:] = np.any(points[:, :, 1:] != points[:, :, :-1], axis=-1)
        order = np.argsort(~new, axis=2, kind="stable")
        points = np.take_along_axis(points, order[..., None], axis=2)
        count = new.sum(axis=2)
        keep = np.arange(int(count.max()))
        last = np.minimum(keep[None, None, :], count[:, :, None] - 1)
        self.bridge = np.take_along_axis(points, last[..., None], axis=2)  # (n_theta, C, n, 2)
        self.bridge_f = self.flat(self.bridge)
        self._seeds: dict[tuple[int, bool], _Stamp] = {}
        self.ext = [
            [
                self._stamp(tuple(self.start[i]), tuple(self.cand[i]), head)
                for head in (None, (int(self.cand[i, 0]), int(self.cand[i, 1])))
            ]
            for i in range(n_cand)
        ]
        # padded tables for the batched target sampler
        seeds = [self.seed(d, True) for d in range(360)]
        self.seed_trace_f, self.seed_trace_ok = _padded([s.trace_f for s in seeds])
        self.seed_probe_f, self.seed_probe_ok = _padded([s.probe_f for s in seeds])
        ext = [self.ext[i][mk] for mk in (0, 1) for i in range(n_cand)]
        trace_f, trace_ok = _padded([s.trace_f for s in ext])
        probe_f, probe_ok = _padded([s.probe_f for s in ext])
        shape = (2, n_cand, -1)
        self.ext_trace_f, self.ext_trace_ok = trace_f.reshape(shape), trace_ok.reshape(shape)
        self.ext_probe_f, self.ext_probe_ok = probe_f.reshape(shape), probe_ok.reshape(shape)

    def flat(self, offsets: np.ndarray) -> np.ndarray:
        return offsets[..., 0] * self.width + offsets[..., 1]

    def _stamp(self, start, head, marker_at) -> _Stamp:
        """The paddle from `start` to `head`, with a marker disc at `marker_at` (or None)."""
        w = self.p.line_half_width
        head = (float(head[0]), float(head[1]))
        discs = [(marker_at, self.p.marker_radius)] if marker_at is not None else []
        trace = _pixels([(start, head)], discs, w)
        probe = np.unique((self.flat(trace)[:, None] + self.struct_f[None, :]).reshape(-1))
        return _Stamp(trace, _pixels([(start, head)], [], w), self.flat(trace), probe)

    def seed(self, d: int, marker: bool) -> _Stamp:
        """The first paddle of a path at orientation index `d`, from its tail (0, 0)."""
        stamp = self._seeds.get((d, marker))
        if stamp is None:
            stamp = self._stamp((0.0, 0.0), tuple(self.seed_head[d]), (0, 0) if marker else None)
            self._seeds[(d, marker)] = stamp
        return stamp


# ---------------------------------------------------------------------------------------
# Sampling


@dataclass
class _Path:
    ident: int
    slot: int  # bit of this path in the `latest` raster
    tail: tuple[int, int]
    head: tuple[int, int]
    pivot: tuple[int, int]
    th: int  # orientation index
    paddles: list  # (origin (y, x), stamp, bridge pixels or None); drawn at the end
    probes: list  # flat canvas positions each paddle added to `near`


class _Sampler:
    """Draws images for one `PathfinderParams` from one numpy Generator.

    The occupancy of an image is kept in padded, flattened rasters: `near` counts, per pixel,
    the paddles whose trace lies within the clearance of it (the trace dilated by the clearance
    disc); `latest` has bit `slot` set where the latest paddle of the path in that slot counts;
    `allowed` marks where traces may go: the image less `padding + m − 1` px at each border (the
    original keeps a 1 px `padding` ring and lets the paddles' soft masks reach about m − 1 px
    into it). A new paddle fits when its trace is allowed and no pixel of it is near a paddle
    other than its own path's latest one (`extend_snake` ignores that one likewise).

    The two target paths are drawn by rejection (`two_snakes` restarts on any failure); the
    attempts are independent, so they run as a vectorised batch, and every success is kept in
    a pool per margin for later images.
    """

    def __init__(self, params: PathfinderParams, rng: np.random.Generator):
        self.p, self.rng = params, rng
        r = params.resolution
        self.pad = math.ceil(params.paddle_length + 4 * max(params.paddle_margins)) + 8
        self.pad += math.ceil(params.marker_radius)
        self.width = r + 2 * self.pad
        self.geom = {m: _Geometry(params, m, self.width) for m in params.paddle_margins}
        self.allowed = {}
        for m in params.paddle_margins:
            allowed = np.zeros((self.width, self.width), dtype=bool)
            lo, hi = self.pad + params.padding + m - 1, self.pad + r - params.padding - m + 1
            allowed[lo:hi, lo:hi] = True
            self.allowed[m] = allowed.reshape(-1)
        self.pool: dict[int, list] = {m: [] for m in params.paddle_margins}
        direction = np.deg2rad(np.arange(360))
        self.second = np.round(
            params.seed_distance * np.stack([np.sin(direction), np.cos(direction)], axis=1)
        ).astype(np.int64)
        self.batch = 256
        self.near = np.zeros(self.width * self.width, dtype=np.int16)
        self.latest = np.zeros(self.width * self.width, dtype=np.uint8)
        self.allowed_now = self.allowed[params.paddle_margins[0]]

    def _f(self, y, x):
        return (y + self.pad) * self.width + x + self.pad

    # -- the two targets, a batch of independent attempts at once ---------------------------

    def _fit_rows(self, near, latest, rows, cells, ok_mask, slot):
        """Per attempt: the trace `cells` (n, k) (where `ok_mask`) allowed and not near any
        paddle but this path's latest (`slot` None: a new path)."""
        allowed = self.allowed_now[cells] | ~ok_mask
        flat = rows[:, None] * near.shape[1] + cells
        count = near.reshape(-1)[flat]
        if slot is not None:
            count = count - ((latest.reshape(-1)[flat] >> slot) & 1)
        return allowed.all(axis=1) & ~((count != 0) & ok_mask).any(axis=1)

    def _put_rows(self, near, latest, rows, cells, ok_mask, slot, previous):
        """Add the probes `cells` (n, k) (where `ok_mask`) to `near` (repeats in a row count
        once) and make them the latest paddle of `slot`, clearing `previous` (flat positions)."""
        flat = ((rows * near.shape[1])[:, None] + cells)[ok_mask]
        near.reshape(-1)[flat] += 1
        bit = np.uint8(1 << slot)
        if previous is not None:
            latest.reshape(-1)[previous] &= ~bit
        latest.reshape(-1)[flat] |= bit
        return flat

    def _target_batch(self, geom: _Geometry) -> int:
        """Run `self.batch` attempts at the two targets; pool the successes. Returns how many
        attempts were made."""
        p, rng, n, r = self.p, self.rng, self.batch, self.p.resolution
        size = self.width * self.width
        near = np.zeros((n, size), dtype=np.int16)
        latest = np.zeros((n, size), dtype=np.uint8)
        rows = np.arange(n)
        cl = p.contour_length
        origin = np.zeros((n, 2, cl, 2), dtype=np.int64)  # per attempt, path, paddle
        choice = np.zeros((n, 2, cl), dtype=np.int64)  # orientation index of each paddle
        pivot = np.zeros((n, 2, 2), dtype=np.int64)
        th = np.zeros((n, 2), dtype=np.int64)
        previous = [None, None]
        # first target: tail and head in the central box [2·seed_distance, R − 2·seed_distance)²
        lo, hi = 2 * p.seed_distance, r - 2 * p.seed_distance
        d = rng.integers(0, 360, n)
        head = geom.seed_head[d]
        y0, y1 = np.maximum(lo, lo - head[:, 0]), np.minimum(hi, hi - head[:, 0])
        x0, x1 = np.maximum(lo, lo - head[:, 1]), np.minimum(hi, hi - head[:, 1])
        alive = (y0 < y1) & (x0 < x1)
        tail = np.stack(
            [rng.integers(y0, np.maximum(y1, y0 + 1)), rng.integers(x0, np.maximum(x1, x0 + 1))],
            axis=1,
        )
        alive &= self._seed_rows(geom, near, latest, rows, alive, tail, d, 0, previous)
        origin[:, 0, 0], choice[:, 0, 0], th[:, 0] = tail, d, d
        pivot[:, 0] = tail + geom.seed_pivot[d]
        # second target: seed_distance px from the first tail, up to max_paddle_retrial + 1 tries
        placed = ~alive
        for _ in range(p.max_paddle_retrial + 1):
            d = rng.integers(0, 360, n)
            tail2 = tail + self.second[rng.integers(0, 360, n)]
            ok = self._seed_rows(geom, near, latest, rows, ~placed, tail2, d, 1, previous)
            origin[ok, 1, 0], choice[ok, 1, 0], th[ok, 1] = tail2[ok], d[ok], d[ok]
            pivot[ok, 1] = tail2[ok] + geom.seed_pivot[d[ok]]
            placed |= ok
        alive &= placed
        # extension, the two paths in turn
        for k in range(1, cl):
            marker = int(k == cl - 1)
            for j in (0, 1):
                live = np.flatnonzero(alive)
                if len(live) == 0:
                    return n
                ok, i, new_pivot, probes = self._extend_rows(
                    geom, near, latest, live, pivot[live, j], th[live, j], j, marker, previous[j]
                )
                alive[live[~ok]] = False
                good = live[ok]
                pivot[good, j], th[good, j] = new_pivot[ok], 360 + i[ok]
                origin[good, j, k], choice[good, j, k] = new_pivot[ok], i[ok]
                previous[j] = probes
        for b in np.flatnonzero(alive):
            self.pool[geom.m].append((near[b].copy(), origin[b], choice[b]))
        return n

    def _seed_rows(self, geom, near, latest, rows, todo, tail, d, slot, previous):
        """Place seed paddles (orientation index `d`, with a marker disc) at `tail` for the
        attempts in `todo` where they fit; returns where they were placed."""
        r = self.p.resolution
        pivot = tail + geom.seed_pivot[d]
        todo = todo & np.all((pivot >= 0) & (pivot < r), axis=1)
        todo &= np.all((tail >= 0) & (tail < r), axis=1)
        idx = np.flatnonzero(todo)
        pos = self._f(tail[idx, 0], tail[idx, 1])
        cells = pos[:, None] + geom.seed_trace_f[d[idx]]
        fits = self._fit_rows(near, latest, rows[idx], cells, geom.seed_trace_ok[d[idx]], None)
        idx = idx[fits]
        probes = pos[fits][:, None] + geom.seed_probe_f[d[idx]]
        flat = self._put_rows(near, latest, idx, probes, geom.seed_probe_ok[d[idx]], slot, None)
        if previous[slot] is None:
            previous[slot] = flat
        else:
            previous[slot] = np.concatenate([previous[slot], flat])
        out = np.zeros(len(rows), dtype=bool)
        out[idx] = True
        return out

    def _extend_rows(self, geom, near, latest, live, pivot, th, slot, marker, previous):
        """One paddle for path `slot` in each live attempt (`extend_snake`)."""
        p, rng, m, n = self.p, self.rng, geom.m, len(live)
        size = near.shape[1]
        pivot = pivot + geom.advance[th]
        inside = np.all((pivot >= -m - 2) & (pivot < p.resolution + m + 2), axis=1)
        pivot = np.where(inside[:, None], pivot, 0)
        pos = self._f(pivot[:, 0], pivot[:, 1])
        heads = pos[:, None] + geom.cand_f[None, :]
        flat = live[:, None] * size + heads
        count = near.reshape(-1)[flat] - ((latest.reshape(-1)[flat] >> slot) & 1)
        free = self.allowed_now[heads] & (count == 0)
        cmf = np.cumsum(geom.weights[th] * free, axis=1)
        total = cmf[:, -1]
        todo = inside & (total >= 1e-4)  # else a dead end
        ok = np.zeros(n, dtype=bool)
        choice = np.zeros(n, dtype=np.int64)
        u = rng.random((n, p.max_paddle_retrial + 1))
        for draw in range(p.max_paddle_retrial + 1):
            idx = np.flatnonzero(todo & ~ok)
            if len(idx) == 0:
                break
            target = u[idx, draw] * total[idx]
            i = np.minimum(np.sum(cmf[idx] <= target[:, None], axis=1), len(geom.cand) - 1)
            cells = np.concatenate([geom.ext_trace_f[marker, i], geom.bridge_f[th[idx], i]], axis=1)
            cells_ok = np.concatenate(
                [
                    geom.ext_trace_ok[marker, i],
                    np.ones(geom.bridge_f.shape[2:], bool)[None].repeat(len(idx), 0),
                ],
                axis=1,
            )
            fits = self._fit_rows(near, latest, live[idx], pos[idx, None] + cells, cells_ok, slot)
            ok[idx[fits]] = True
            choice[idx[fits]] = i[fits]
        good = np.flatnonzero(ok)
        i = choice[good]
        bridge = geom.bridge_f[th[good], i]  # (g, nb)
        extra = bridge[:, :, None] + geom.square_f[None, None, :]
        extra = extra.reshape(len(good), bridge.shape[1] * len(geom.square_f))
        probes = np.concatenate([geom.ext_probe_f[marker, i], extra], axis=1)
        probes_ok = np.concatenate(
            [geom.ext_probe_ok[marker, i], np.ones(extra.shape, bool)], axis=1
        )
        flat = self._put_rows(
            near, latest, live[good], pos[good, None] + probes, probes_ok, slot, previous
        )
        return ok, choice, pivot, flat

    def _targets(self, geom: _Geometry) -> list[_Path]:
        p, pool, attempts = self.p, self.pool[geom.m], 0
        while not pool:
            if attempts >= p.max_target_attempts:
                raise DatasetError(
                    f"could not place the two {p.contour_length}-paddle target paths in a "
                    f"{p.resolution}x{p.resolution} image in {attempts} attempts "
                    f"(paddle_length {p.paddle_length}, margin {geom.m}, continuity "
                    f"{p.continuity}); the parameters leave too little room: shorten the paths "
                    "or enlarge the image"
                )
            attempts += self._target_batch(geom)
        near, origin, choice = pool.pop(0)
        self.near[:] = near
        self.latest[:] = 0
        paths = []
        for j in (0, 1):
            d = int(choice[j, 0])
            tail = (int(origin[j, 0, 0]), int(origin[j, 0, 1]))
            paddles = [(tail, geom.seed(d, True), None)]
            prev = d
            for k in range(1, p.contour_length):
                i = int(choice[j, k])
                stamp = geom.ext[i][int(k == p.contour_length - 1)]
                at = (int(origin[j, k, 0]), int(origin[j, k, 1]))
                paddles.append((at, stamp, geom.bridge[prev, i]))
                prev = 360 + i
            at, i = paddles[-1][0], int(choice[j, -1])
            head = (at[0] + int(geom.cand[i, 0]), at[1] + int(geom.cand[i, 1]))
            paths.append(_Path(j + 1, j, tail, head, at, prev, paddles, []))
        return paths

    # -- distractors, one path at a time (`make_many_snakes`, `make_snake`) -----------------

    def _fits(self, cells: np.ndarray, path: _Path | None) -> bool:
        """`cells`: flat canvas positions of a new paddle's trace."""
        if not self.allowed_now[cells].all():
            return False
        count = self.near[cells]
        if path is not None and path.paddles:
            count = count - ((self.latest[cells] >> path.slot) & 1)
        return not count.any()

    def _put(self, path: _Path, origin, stamp: _Stamp, bridge, geom: _Geometry) -> None:
        pos = self._f(*origin)
        probe = pos + stamp.probe_f
        if bridge is not None:
            extra = geom.flat(bridge)[:, None] + geom.square_f[None, :]
            probe = np.concatenate([probe, pos + extra.reshape(-1)])
        self.near[probe] += 1  # repeated positions count once
        bit = np.uint8(1 << path.slot)
        if path.probes:
            self.latest[path.probes[-1]] &= ~bit
        self.latest[probe] |= bit
        path.paddles.append((origin, stamp, bridge))
        path.probes.append(probe)

    def _remove(self, path: _Path) -> None:
        for probe in path.probes:
            self.near[probe] -= 1
        if path.probes:
            self.latest[path.probes[-1]] &= ~np.uint8(1 << path.slot)

    def _extend(self, geom: _Geometry, path: _Path) -> bool:
        p, m = self.p, geom.m
        py, px = (
            path.pivot[0] + int(geom.advance[path.th, 0]),
            path.pivot[1] + int(geom.advance[path.th, 1]),
        )
        if not (-m - 2 <= py < p.resolution + m + 2 and -m - 2 <= px < p.resolution + m + 2):
            return False
        pos = self._f(py, px)
        heads = pos + geom.cand_f
        count = self.near[heads] - ((self.latest[heads] >> path.slot) & 1)
        free = self.allowed_now[heads] & (count == 0)
        cmf = np.cumsum(geom.weights[path.th] * free)
        total = float(cmf[-1])
        if total < 1e-4:
            return False  # dead end
        for _ in range(p.max_paddle_retrial + 1):
            i = int(np.searchsorted(cmf, self.rng.random() * total, side="right"))
            i = min(i, len(cmf) - 1)
            stamp = geom.ext[i][0]
            cells = pos + np.concatenate([stamp.trace_f, geom.bridge_f[path.th, i]])
            if self._fits(cells, path):
                self._put(path, (py, px), stamp, geom.bridge[path.th, i], geom)
                path.pivot = (py, px)
                path.head = (py + int(geom.cand[i, 0]), px + int(geom.cand[i, 1]))
                path.th = 360 + i
                return True
        return False

    def _seed_distractor(self, geom: _Geometry, ident: int) -> _Path | None:
        """A tail drawn uniformly among those where the first paddle fits (`seed_snake`)."""
        p, rng, r, pad, w = self.p, self.rng, self.p.resolution, self.pad, self.width
        inner = self.near.reshape(w, w)[pad : pad + r, pad : pad + r]
        free = np.flatnonzero(inner == 0)
        if len(free) < p.stop_with_availability * r * r:
            return None
        for _ in range(p.max_paddle_retrial + 1):
            d = int(rng.integers(0, 360))
            stamp = geom.seed(d, False)
            # rejection from the free pixels, then (rarely needed) the exact set of valid tails:
            # either way the tail is uniform over the valid ones
            for _ in range(32):
                tail = divmod(int(free[rng.integers(len(free))]), r)
                path = self._start(ident, geom, tail, d, stamp)
                if path is not None:
                    return path
            valid = self._valid_tails(stamp)
            if len(valid) == 0:
                return None  # no room at this orientation ends the path, as in the original
            path = self._start(
                ident, geom, divmod(int(valid[rng.integers(len(valid))]), r), d, stamp
            )
            if path is not None:
                return path
        return None

    def _start(self, ident, geom: _Geometry, tail, d: int, stamp: _Stamp) -> _Path | None:
        r = self.p.resolution
        pivot = (tail[0] + int(geom.seed_pivot[d, 0]), tail[1] + int(geom.seed_pivot[d, 1]))
        if not (0 <= pivot[0] < r and 0 <= pivot[1] < r):
            return None
        if not self._fits(self._f(*tail) + stamp.trace_f, None):
            return None
        head = (tail[0] + int(geom.seed_head[d, 0]), tail[1] + int(geom.seed_head[d, 1]))
        path = _Path(ident, 2, tail, head, pivot, d, [], [])
        self._put(path, tail, stamp, None, geom)
        return path

    def _valid_tails(self, stamp: _Stamp) -> np.ndarray:
        """Flat (row-major, R×R) tails at which `stamp` fits a new path."""
        r, pad, w = self.p.resolution, self.pad, self.width
        near, allowed = self.near.reshape(w, w), self.allowed_now.reshape(w, w)
        ok = np.ones((r, r), dtype=bool)
        for dy, dx in stamp.trace:
            window = (slice(pad + dy, pad + dy + r), slice(pad + dx, pad + dx + r))
            ok &= allowed[window] & (near[window] == 0)
        return np.flatnonzero(ok)

    def _distractors(self, geom: _Geometry) -> list[_Path]:
        p, paths = self.p, []
        for j in range(p.num_distractor_snakes):
            for _ in range(p.max_distractor_contour_retrial + 1):
                path = self._seed_distractor(geom, 3 + j)
                if path is None:
                    continue
                if all(self._extend(geom, path) for _ in range(p.distractor_length - 1)):
                    self.latest[path.probes[-1]] &= ~np.uint8(1 << path.slot)
                    paths.append(path)
                    break
                self._remove(path)
        return paths

    # -- a whole image (`snakes2.py: from_wrapper`) -----------------------------------------

    def sample(self, label: int) -> PathfinderSample:
        p, rng = self.p, self.rng
        margin = p.paddle_margins[int(rng.integers(len(p.paddle_margins)))]
        geom = self.geom[margin]
        self.allowed_now = self.allowed[margin]
        targets = self._targets(geom)
        paths = targets + self._distractors(geom)
        origin = int(rng.integers(2))
        end = origin if label == 1 else 1 - origin
        a, b = targets[origin].tail, targets[end].head
        r = p.resolution
        image = np.zeros((r, r), dtype=np.uint8)
        trace = np.zeros((r, r), dtype=np.int16)
        for path in paths:
            for (y, x), stamp, bridge in path.paddles:
                image[stamp.drawn[:, 0] + y, stamp.drawn[:, 1] + x] = p.path_value
                trace[stamp.trace[:, 0] + y, stamp.trace[:, 1] + x] = path.ident
                if bridge is not None:
                    trace[bridge[:, 0] + y, bridge[:, 1] + x] = path.ident
        for cy, cx in (a, b):
            image[geom.marker[:, 0] + cy, geom.marker[:, 1] + cx] = p.marker_value
        return PathfinderSample(image, trace, (a, b), int(label), int(margin))


def sample_pathfinder_image(
    params: PathfinderParams, rng: np.random.Generator, label: int
) -> PathfinderSample:
    """Draw one image with the given `label` (1: the markers are on the same path)."""
    if label not in (0, 1):
        raise ValueError(f"label must be 0 or 1, got {label!r}")
    return _Sampler(params, rng).sample(label)


# ---------------------------------------------------------------------------------------
# Writing the release layout


def _png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def _is_generated(folder: Path) -> bool:
    try:
        return json.loads((folder / _PROVENANCE).read_text()).get("generated") is True
    except (OSError, ValueError, AttributeError):
        return False


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def generate_pathfinder(
    target_dir: str | os.PathLike,
    *,
    resolution: int = 32,
    n_images: int = 2000,
    seed: int = 0,
    params: PathfinderParams | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Generate Pathfinder (`resolution=32`) or Path-X (`resolution=128`) like the LRA release.

    Writes `target_dir/pathfinder{R}/curv_contour_length_14/` (built under a temporary name
    and renamed when complete; each PNG is also written to a temporary name, then renamed):
    `imgs/<b>/sample_<k>.png`, `metadata/<b>.npy` (text) and `generator.json` (provenance:
    `"generated": true`, seed, parameters). Labels are balanced (`n_images // 2` of one class,
    the rest of the other). The same arguments give byte-identical files.
    `prepare_pathfinder(target_dir, resolution=R)` reads the result.

    **Arguments:**
    - `resolution`: 32 or 128.
    - `n_images`: how many images (the release has 200,000 per difficulty).
    - `seed`: seeds a numpy `Generator`, the only source of randomness.
    - `params`: override `lra_pathfinder_params(resolution)` (its resolution must match).
    - `overwrite`: replace an existing folder, only if it was generated here (a folder
      without our `generator.json` may be the LRA release and is never replaced).
    - `progress`: progress lines on stderr.

    **Returns:** the `pathfinder{R}` folder.
    """
    if (
        isinstance(resolution, bool)
        or resolution not in RESOLUTIONS
        or isinstance(resolution, float)
    ):
        raise ValueError(f"resolution must be 32 (Pathfinder) or 128 (Path-X), got {resolution!r}")
    n_images = _check_int("n_images", n_images, 1)
    seed = _check_int("seed", seed, 0)
    params = params if params is not None else lra_pathfinder_params(resolution)
    if params.resolution != resolution:
        raise ValueError(f"params.resolution is {params.resolution} but resolution is {resolution}")
    folder = Path(target_dir).expanduser() / f"pathfinder{resolution}" / params.difficulty
    if folder.exists():
        if not overwrite:
            raise DatasetError(
                f"{folder} already exists; refusing to replace it. Pass overwrite=True "
                "(only a folder generated here is replaced) or choose another target folder"
            )
        if not _is_generated(folder):
            raise DatasetError(
                f"{folder} exists and was not generated here (no {_PROVENANCE} marking it "
                "generated); it may be the LRA release, so it is not replaced. Choose another "
                "target folder"
            )
    rng = np.random.default_rng(seed)
    labels = rng.permutation((np.arange(n_images) + int(rng.integers(2))) % 2)
    sampler = _Sampler(params, rng)
    n_contrasts = 1  # paddle_contrast_list has one entry in LRA's settings
    report = Progress(f"pathfinder{resolution} generate", n_images, enabled=progress, every=500)
    with atomic_dir(folder) as tmp:
        (tmp / "metadata").mkdir()
        for batch, start in enumerate(range(0, n_images, params.images_per_batch)):
            images = tmp / "imgs" / str(batch)
            images.mkdir(parents=True)
            lines = []
            for k in range(min(params.images_per_batch, n_images - start)):
                sample = sampler.sample(int(labels[start + k]))
                name = f"sample_{k}.png"
                atomic_write_bytes(images / name, _png_bytes(sample.image))
                lines.append(
                    f"imgs/{batch} {name} {k} {sample.label} {params.continuity} "
                    f"{params.contour_length} {params.distractor_length} "
                    f"{params.paddle_length} {params.paddle_thickness} {sample.margin} "
                    f"{n_contrasts}\n"
                )
                report.step(start + k + 1)
            atomic_write_text(tmp / "metadata" / f"{batch}.npy", "".join(lines))
        provenance = {
            "generated": True,
            "generator": _GENERATOR,
            "algorithm": "Linsley et al. (drewlinsley/pathfinder snakes2.py), re-implemented; "
            "synthetic data, not comparable with published LRA numbers",
            "seed": seed,
            "n_images": n_images,
            "labels": {"0": int(np.sum(labels == 0)), "1": int(np.sum(labels == 1))},
            "params": dataclasses.asdict(params),
        }
        atomic_write_text(
            tmp / _PROVENANCE, json.dumps(provenance, indent=2, sort_keys=True) + "\n"
        )
    report.done(n_images)
    return folder.parent
