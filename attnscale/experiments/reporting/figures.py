"""Figures for sweeps and studies: matplotlib without pyplot, stable PNG bytes.

Figures are built with `matplotlib.figure.Figure` (the object-oriented API), so
no GUI backend or pyplot global state is involved; `savefig` renders with Agg.
A notebook displays them as the value of a cell (after `%matplotlib inline`).

Every PNG is written by `save_figure` (or `write_png`), one place: no text chunk
(no matplotlib version, no timestamp: PNG has none unless asked), 256 colours
chosen by median cut without dithering (a plot has few colours; about a third of
the bytes of the full-colour file, the same look), so the same figure gives the
same bytes on every run and machine with the same matplotlib and fonts, and a
committed figure changes only when its data does.

A figure is saved as OUT_DIR/NAME.png, next to the NAME.csv and NAME.md tables
of the same rows (`attnscale.experiments.reporting.tables`).
"""

from __future__ import annotations

import io
import os

from matplotlib.axes import Axes
from matplotlib.figure import Figure

# Saved PNGs carry no "Software" (matplotlib version) entry, so the same
# figure gives the same bytes on every run and machine with the same fonts.
PNG_METADATA = {"Software": None}
DPI = 120

# One colour and marker per series, the same sequence in every figure.
_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:gray", "tab:olive", "tab:cyan"]
_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "*", "<", ">"]


def new_figure(width: float, height: float) -> Figure:
  """An empty figure of WIDTH x HEIGHT inches with constrained layout (no pyplot)."""
  return Figure(figsize=(width, height), layout="constrained")


def style(i: int) -> dict:
  """Line style for the i-th series: colour and marker (distinct for i < 100: the
  marker shifts by one each time the colours come round)."""
  return {"color": _COLORS[i % len(_COLORS)],
          "marker": _MARKERS[(i + i // len(_COLORS)) % len(_MARKERS)]}


def label_axes(ax: Axes, *, xlabel: str, ylabel: str, title: str) -> None:
  """Axis labels, title, a light grid, and a legend when some line has a label."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(True, alpha=0.3)
  if ax.get_legend_handles_labels()[0]:  # an empty legend only warns
    ax.legend()


def save_figure(fig: Figure, out_dir: str, name: str) -> str:
  """Writes OUT_DIR/NAME.png (DPI, no metadata, `write_png`'s palette); returns the path."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{name}.png")
  rendered = io.BytesIO()
  fig.savefig(rendered, format="png", dpi=DPI, metadata=PNG_METADATA)
  write_png(rendered, path)
  return path


def write_png(source, path: str) -> None:
  """Writes the PNG `source` (a path or file object) to `path` with 256 colours
  (median cut, no dither: deterministic) and no text or time chunk."""
  from PIL import Image  # matplotlib's own dependency
  with Image.open(source) as image:
    palette = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                            dither=Image.Dither.NONE)
  palette.save(path, format="png", optimize=True)
