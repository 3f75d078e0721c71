"""Training curves as a PNG, drawn with Pillow only.

One panel per metric (e.g. `loss`, `accuracy`); each panel shows the train, validation and
test curves per epoch that the records hold: for metric `m`, the keys `m` or `train_m`,
`val_m` and `test_m`. The panel title holds the metric name (left) and the legend (right),
above the plot area, so the legend never hides a curve.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

__all__ = ["SPLIT_COLORS", "plot_curves"]

# Panel layout (pixels).
PANEL_SIZE = (480, 320)
_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 64, 16, 30, 36
_TITLE_HEIGHT = 30

_BACKGROUND = (255, 255, 255)
_AXIS = (0, 0, 0)
_GRID = (225, 225, 225)
_TEXT = (0, 0, 0)
SPLIT_COLORS = {
    "train": (31, 119, 180),
    "val": (255, 127, 14),
    "test": (44, 160, 44),
}
_PREFIXES = tuple(f"{split}_" for split in SPLIT_COLORS)

Font = ImageFont.ImageFont | ImageFont.FreeTypeFont


def _load_font(size: int) -> Font:
    """Pillow's default font, scalable where the installed Pillow supports it."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ValueError, OSError, ImportError):  # Pillow < 10.1 or no FreeType
        return ImageFont.load_default()


def _base_metric(name: str) -> str:
    """`val_loss` → `loss`: the metric name without its split prefix."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _number(value: Any) -> float | None:
    """A finite float, or `None` for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _series(
    records: Sequence[Mapping[str, Any]], key: str, x: str
) -> list[tuple[float, float | None]]:
    """The (x, y) points of `key`; y is `None` where not finite (a gap in the curve)."""
    points = []
    for r in records:
        if key in r and _number(r.get(x)) is not None:
            points.append((float(r[x]), _number(r[key])))
    return points


def _panel_series(
    records: Sequence[Mapping[str, Any]], metric: str, x: str
) -> dict[str, list[tuple[float, float | None]]]:
    """Split → points for one metric, only the splits present in the records."""
    out = {}
    for split in SPLIT_COLORS:
        keys = [metric, f"train_{metric}"] if split == "train" else [f"{split}_{metric}"]
        for key in keys:
            points = _series(records, key, x)
            if any(y is not None for _, y in points):
                out[split] = points
                break
    return out


def _nice_step(span: float, target: int = 5) -> float:
    """A step of 1, 2 or 5 × 10^k giving about `target` intervals over `span`."""
    raw = span / max(target, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * magnitude >= raw:
            return factor * magnitude
    return 10 * magnitude


def _axis_range(values: list[float], integer: bool = False) -> tuple[float, float]:
    """The limits of an axis: the data range padded by 5% (3% on an integer axis)."""
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-12 * max(abs(lo), abs(hi), 1.0):
        pad = 0.5 if integer else max(abs(lo) * 0.05, 0.05)
        return lo - pad, hi + pad
    pad = (0.03 if integer else 0.05) * (hi - lo)
    return lo - pad, hi + pad


def _ticks(lo: float, hi: float, integer: bool = False) -> list[float]:
    """Tick positions at a nice step within [lo, hi]."""
    step = _nice_step(hi - lo)
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(lo / step - 1e-9) * step
    n = math.floor((hi - first) / step + 1e-9) + 1
    return [first + i * step for i in range(max(n, 0))]


def _tick_label(value: float) -> str:
    """A short tick label."""
    if abs(value) < 1e-12:
        return "0"
    return f"{value:.3g}"


class _Frame:
    """Maps data coordinates to the pixels of one panel's plot area."""

    def __init__(self, box: tuple[int, int, int, int], xlim, ylim):
        self.box = box
        self.xlim = xlim
        self.ylim = ylim

    def px(self, x: float, y: float) -> tuple[float, float]:
        """Pixel of the data point (x, y)."""
        left, top, right, bottom = self.box
        fx = (x - self.xlim[0]) / (self.xlim[1] - self.xlim[0])
        fy = (y - self.ylim[0]) / (self.ylim[1] - self.ylim[0])
        return left + fx * (right - left), bottom - fy * (bottom - top)


def _text_size(draw: ImageDraw.ImageDraw, text: str, font: Font) -> tuple[int, int]:
    """Width and height of `text`."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    return int(right - left), int(bottom - top)


def _draw_axes(draw: ImageDraw.ImageDraw, frame: _Frame, font: Font, xlabel: str) -> None:
    """Grid, axes, tick marks and tick labels of a panel."""
    left, top, right, bottom = frame.box
    for t in _ticks(*frame.ylim):
        _, py = frame.px(frame.xlim[0], t)
        draw.line([(left, py), (right, py)], fill=_GRID)
        draw.line([(left - 4, py), (left, py)], fill=_AXIS)
        w, h = _text_size(draw, _tick_label(t), font)
        draw.text((left - 6 - w, py - h / 2 - 2), _tick_label(t), fill=_TEXT, font=font)
    for t in _ticks(*frame.xlim, integer=True):
        px, _ = frame.px(t, frame.ylim[0])
        draw.line([(px, top), (px, bottom)], fill=_GRID)
        draw.line([(px, bottom), (px, bottom + 4)], fill=_AXIS)
        w, _ = _text_size(draw, _tick_label(t), font)
        draw.text((px - w / 2, bottom + 6), _tick_label(t), fill=_TEXT, font=font)
    draw.rectangle([left, top, right, bottom], outline=_AXIS)
    w, h = _text_size(draw, xlabel, font)
    draw.text(((left + right - w) / 2, bottom + 8 + h), xlabel, fill=_TEXT, font=font)


def _draw_curve(
    draw: ImageDraw.ImageDraw,
    frame: _Frame,
    points: list[tuple[float, float | None]],
    color: tuple[int, int, int],
) -> None:
    """A polyline through the finite points (broken at gaps), with small markers."""
    segment: list[tuple[float, float]] = []
    pixels = [None if y is None else frame.px(x, y) for x, y in points]
    for p in [*pixels, None]:
        if p is not None:
            segment.append(p)
            continue
        if len(segment) > 1:
            draw.line(segment, fill=color, width=2)
        segment = []
    if len(pixels) <= 50:
        for p in pixels:
            if p is not None:
                draw.ellipse([p[0] - 2, p[1] - 2, p[0] + 2, p[1] + 2], fill=color)


def _draw_header(
    draw: ImageDraw.ImageDraw, origin: tuple[int, int], title: str, splits, font: Font
) -> None:
    """Panel title (left) and legend (right) above the plot area."""
    ox, oy = origin
    draw.text((ox + _MARGIN_LEFT, oy + 8), title, fill=_TEXT, font=font)
    x = ox + PANEL_SIZE[0] - _MARGIN_RIGHT
    for split in reversed(list(splits)):
        w, h = _text_size(draw, split, font)
        x -= w
        draw.text((x, oy + 8), split, fill=_TEXT, font=font)
        x -= 18
        draw.line(
            [(x, oy + 8 + h / 2 + 2), (x + 14, oy + 8 + h / 2 + 2)],
            fill=SPLIT_COLORS[split],
            width=3,
        )
        x -= 10


def _draw_panel(
    draw: ImageDraw.ImageDraw,
    origin: tuple[int, int],
    metric: str,
    series: dict[str, list[tuple[float, float | None]]],
    font: Font,
    xlabel: str,
) -> None:
    """One metric's panel at `origin` (top-left pixel)."""
    ox, oy = origin
    box = (
        ox + _MARGIN_LEFT,
        oy + _MARGIN_TOP,
        ox + PANEL_SIZE[0] - _MARGIN_RIGHT,
        oy + PANEL_SIZE[1] - _MARGIN_BOTTOM,
    )
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts if y is not None]
    frame = _Frame(box, _axis_range(xs, integer=True), _axis_range(ys))
    _draw_axes(draw, frame, font, xlabel)
    for split, points in series.items():
        _draw_curve(draw, frame, points, SPLIT_COLORS[split])
    _draw_header(draw, origin, metric, series, font)


def _panels(
    records: Sequence[Mapping[str, Any]], metrics: Sequence[str], x: str
) -> list[tuple[str, dict]]:
    """(metric, series) of the panels to draw, one per distinct base metric with data."""
    bases = list(dict.fromkeys(_base_metric(m) for m in metrics))
    panels = [(m, _panel_series(records, m, x)) for m in bases]
    return [(m, s) for m, s in panels if s]


def _save_atomic(image: Image.Image, path: Path) -> None:
    """Write a PNG through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    image.save(tmp, format="PNG")
    os.replace(tmp, path)


def plot_curves(
    records: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    metrics: Sequence[str] = ("loss", "accuracy"),
    kind: str | None = "epoch",
    x: str = "epoch",
    title: str | None = None,
    columns: int = 2,
) -> Path:
    """Draw training curves to a PNG file (written atomically).

    **Arguments:**
    - `records`: metric records, e.g. from `read_metrics`.
    - `path`: the PNG file to write.
    - `metrics`: the metrics, one panel each; split prefixes are ignored, so
      `("loss", "val_loss", "val_accuracy")` gives the panels `loss` and `accuracy`, each with
      the train (`m` or `train_m`), val (`val_m`) and test (`test_m`) curves found. Metrics
      without data get no panel.
    - `kind`: use only the records of this kind (`None`: all records).
    - `x`: the record key of the horizontal axis.
    - `title`: a title above the panels.
    - `columns`: panels per row.

    **Returns:** the path written. The image is `columns' × 480` wide (`columns'` = the
    number of columns actually used) and `rows × 320` high, plus 30 pixels with a title;
    with no data at all it is a single panel saying so.
    """
    if kind is not None:
        records = [r for r in records if r.get("kind") == kind]
    panels = _panels(records, metrics, x)
    ncols = max(1, min(columns, len(panels)))
    nrows = max(1, math.ceil(len(panels) / ncols))
    header = _TITLE_HEIGHT if title else 0
    size = (ncols * PANEL_SIZE[0], nrows * PANEL_SIZE[1] + header)
    image = Image.new("RGB", size, _BACKGROUND)
    draw = ImageDraw.Draw(image)
    font = _load_font(12)
    if title:
        w, _ = _text_size(draw, title, _load_font(15))
        draw.text(((size[0] - w) / 2, 7), title, fill=_TEXT, font=_load_font(15))
    for i, (metric, series) in enumerate(panels):
        origin = ((i % ncols) * PANEL_SIZE[0], header + (i // ncols) * PANEL_SIZE[1])
        _draw_panel(draw, origin, metric, series, font, x)
    if not panels:
        draw.text((_MARGIN_LEFT, header + PANEL_SIZE[1] // 2), "no data", fill=_TEXT, font=font)
    path = Path(path)
    _save_atomic(image, path)
    return path
