"""The normalisers study's figures (attnscale/studies/normalisers.py): loss against
rate per label, sinks and kurtosis per label and layer, loss against evaluated length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from attnscale.experiments import reporting
from attnscale.studies.normalisers_runs import (
  REFERENCE,
  SOFTMAX_FAMILY,
  at_length,
  best_runs,
  lengths_of,
  mean_finite,
  order,
  ordered_best,
  value,
)


def _family(label: str) -> int:
  """0 for the softmax family, 1 for the non-softmax normalisers (and any other)."""
  return 0 if label in SOFTMAX_FAMILY else 1


def plot_rates(rows: Sequence[dict]):
  """Final training loss against learning rate, a panel per label (4 a row, each
  normaliser beside its QK-norm twin): seed dots, the seed-mean line, the best rate
  ringed, diverged seeds as x on the top edge, softmax's seed means in grey."""
  labels = order(r["label"] for r in rows)
  best = best_runs(rows)
  finite = [r["final_train_loss"] for r in rows if math.isfinite(r["final_train_loss"])]
  low = min(finite) if finite else 0.0
  # The near-best region, tall enough for every label's best seed mean (the BERT's
  # labels lie 1.2 nats apart): diverged and far rates sit on the top edge.
  best_mean = {k: mean_finite(r["final_train_loss"] for r in at) for k, (_, at) in best.items()}
  top = max([low + 0.8] + [m + 0.4 for m in best_mean.values() if math.isfinite(m)])
  cols = 4
  fig = reporting.new_figure(3.2 * cols, 2.6 * math.ceil(len(labels) / cols))
  axes = fig.subplots(math.ceil(len(labels) / cols), cols, squeeze=False, sharex=True,
                      sharey=True)
  reference = _seed_means(rows, REFERENCE)
  for ax, label in zip(axes.flat, labels):
    if label != REFERENCE and reference:
      ax.plot(*zip(*reference), color="0.6", ls="--", lw=1, label=REFERENCE)
    style = reporting.style(_family(label))
    means = _seed_means(rows, label)
    if means:
      ax.plot(*zip(*means), color=style["color"], lw=1.5)
    runs = [r for r in rows if r["label"] == label]
    done = [r for r in runs if math.isfinite(r["final_train_loss"])]
    ax.plot([r["learning_rate"] for r in done],
            [min(r["final_train_loss"], top) for r in done], ".", color=style["color"],
            alpha=0.6, ms=6)
    diverged = [r["learning_rate"] for r in runs if not math.isfinite(r["final_train_loss"])]
    ax.plot(diverged, [top] * len(diverged), "x", color="tab:red", ms=6)
    if label in best:
      ax.plot([best[label][0]], [best_mean[label]], "o", mfc="none", color="k", ms=10)
    seeds = len(best.get(label, (0, []))[1])
    ax.set_title(f"{label} ({seeds} seed{'s' * (seeds != 1)} at best)", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_ylim(low - 0.05, top + 0.05)
    ax.grid(True, alpha=0.3)
  for ax in axes.flat[len(labels):]:
    ax.set_visible(False)
  for ax in axes[-1]:
    ax.set_xlabel("learning rate")
  for ax in axes[:, 0]:
    ax.set_ylabel("final training loss")
  if reference and len(labels) > 1:  # softmax's panel is the first: its line, the second's
    axes.flat[1].legend(fontsize=7, loc="upper left")
  fig.suptitle("Loss against learning rate: dots seeds, line seed mean, ring the best "
               "rate, x diverged (drawn at the top)")
  return fig


def _seed_means(rows: Sequence[dict], label: str) -> list[tuple[float, float]]:
  """(rate, seed mean) of the rates where every seed of `label` finished."""
  by_rate: dict[float, list[float]] = {}
  for r in rows:
    if r["label"] == label:
      by_rate.setdefault(r["learning_rate"], []).append(r["final_train_loss"])
  return [(lr, float(np.mean(v))) for lr, v in sorted(by_rate.items())
          if all(map(math.isfinite, v))]


def plot_sinks(layers: Sequence[dict]):
  """Sink rate, the heaviest key's weight (where eval.json has it) and kurtosis per
  label (rows) and layer (columns), seed means at the best rate, each cell written in;
  kurtosis on a log colour scale (massive activations put it in the hundreds, a
  Gaussian stream has 3)."""
  from matplotlib.colors import LogNorm, Normalize

  labels = list(dict.fromkeys(r["label"] for r in layers))
  depth = max((r["layer"] for r in layers), default=-1) + 1
  keys = [k for k in ("sink_rate", "top_key_weight", "kurtosis")
          if any(k in r for r in layers)] or ["sink_rate", "kurtosis"]
  fig = reporting.new_figure(6 * len(keys), 1.0 + 0.38 * max(len(labels), 1))
  for ax, key in zip(fig.subplots(1, len(keys), squeeze=False)[0], keys):
    fmt = ".1f" if key == "kurtosis" else ".2f"
    grid_LY = np.full((max(len(labels), 1), max(depth, 1)), np.nan)
    for r in layers:
      grid_LY[labels.index(r["label"]), r["layer"]] = r[key]
    finite = grid_LY[np.isfinite(grid_LY)]
    norm = (LogNorm(finite.min(), max(finite.max(), finite.min() * 1.01))
            if key == "kurtosis" and finite.size and finite.min() > 0 else
            Normalize(0.0, max(finite.max(), 1e-6) if finite.size else 1.0))
    image = ax.imshow(grid_LY, aspect="auto", cmap="viridis", norm=norm)
    for (i, j), v in np.ndenumerate(grid_LY):
      if math.isfinite(v):  # dark text on the bright end of viridis
        ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=7,
                color="k" if norm(v) > 0.6 else "w")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xticks(range(depth))
    fig.colorbar(image, ax=ax, shrink=0.8)
    ax.set_xlabel("layer")
    ax.set_title(f"{key} (seed mean at the best rate)")
  return fig


def plot_lengths(rows: Sequence[dict]):
  """Validation loss against evaluated length, the softmax family and the non-softmax
  normalisers in two panels: seed mean at the best rate, band the seeds' range; the
  QK-norm twins dashed; the training length dotted."""
  lengths = lengths_of(rows)
  fig = reporting.new_figure(13, 4.8)
  axes = fig.subplots(1, 2, sharey=True)
  colours: list[dict[str, int]] = [{}, {}]  # per panel: a twin takes its normaliser's
  for label, (_, runs) in ordered_best(rows):
    loss_RL = np.array([[value(r, at_length(L)) for L in lengths] for r in runs])
    loss_RL = loss_RL[np.all(np.isfinite(loss_RL), axis=1)] if loss_RL.size else loss_RL
    if not lengths or not len(loss_RL):
      continue
    family, base = _family(label), label.removesuffix("_qk_rmsnorm")
    ax = axes[family]
    style = reporting.style(colours[family].setdefault(base, len(colours[family])))
    ax.plot(lengths, loss_RL.mean(0), label=f"{label} ({len(loss_RL)})",
            ls="--" if label.endswith("_qk_rmsnorm") else "-", **style)
    ax.fill_between(lengths, loss_RL.min(0), loss_RL.max(0), color=style["color"], alpha=0.12)
  train = {r["train_len"] for r in rows}
  for ax, title in zip(axes, ("softmax and its amendments", "non-softmax normalisers "
                              "(dashed: + RMS QK-norm)")):
    ax.set_xscale("log", base=2)
    for L in train:
      ax.axvline(L, color="k", lw=0.8, ls=":")
    reporting.label_axes(ax, xlabel="evaluation length", ylabel="validation loss (nats)",
                         title=title + "; (n): seeds")
  return fig

