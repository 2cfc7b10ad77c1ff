"""Matplotlib helpers shared by the studies: figures without pyplot, stable PNGs.

Figures are built with `matplotlib.figure.Figure` (the object-oriented API), so
no GUI backend or pyplot global state is involved; `savefig` renders with Agg.
A notebook displays them as the value of a cell (after `%matplotlib inline`).
"""

from __future__ import annotations

import os

from matplotlib.figure import Figure

# Saved PNGs carry no "Software" (matplotlib version) entry, so the same
# figure gives the same bytes on every run and machine with the same fonts.
PNG_METADATA = {"Software": None}
DPI = 120

# One colour and marker per scaling, the same in every study's figure.
_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:gray", "tab:olive", "tab:cyan"]
_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "*", "<", ">"]


def new_figure(width: float, height: float) -> Figure:
  return Figure(figsize=(width, height), layout="constrained")


def style(i: int) -> dict:
  """Line style for the i-th series: colour and marker."""
  return {"color": _COLORS[i % len(_COLORS)], "marker": _MARKERS[i % len(_MARKERS)]}


def save_figure(fig: Figure, out_dir: str, name: str) -> str:
  """Writes OUT_DIR/NAME.png; returns the path."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{name}.png")
  fig.savefig(path, dpi=DPI, metadata=PNG_METADATA)
  return path
