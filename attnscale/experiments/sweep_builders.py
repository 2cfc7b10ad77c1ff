"""The shapes of a sweep, written once: a config's `<config>_sweeps.py` holds only data.

A sweeps file maps each sweep's name to a `Sweep` (its preset and its points, a
function of the sweep's workdir) built by one of these:

    grid          every scaling x learning rate x seed
    seeds_first   every seed x label ({label: (scaling, overrides)}), seed-major
    listed        the runs as written: (scaling, overrides, seeds) in order
    staged        the staged learning-rate search (attnscale/experiments/lr_search.py)
    axis_search   the staged search of every label at every value of one field
                  (width, depth), the smallest value's best rate transferred to the rest
    sensitivity   each label from two octaves below its best rate up to a top rate
    length        scaling x positions x seed, then eval.py at longer lengths
    length_search `length`, with each length law's gamma chosen on a held-out length
    precision     scaling x number format x seed

`attnscale.experiments.sweeps.load_sweep` turns the points into `Point`s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence

from attnscale.config import labels

Labels = Mapping[str, tuple[str, dict]]  # label -> (the argument's scaling, field overrides)


@dataclasses.dataclass(frozen=True)
class Sweep:
  """One named sweep: its preset (which sets its default pack) and its points, a
  function of the sweep's workdir (a staged search reads what has finished there)."""

  preset: str
  points: Callable[[str | None], list[dict]]


def point(preset: str, scaling: str, seed: int, overrides: dict, **extra) -> dict:
  """One point: `preset=P,scaling=S,seed=N` plus field overrides (and `eval` flags,
  and the `label` the sweep declares for the run: its config's `label`)."""
  return {"arg": f"preset={preset},scaling={scaling},seed={seed}", "overrides": overrides,
          **extra}


def grid(preset: str, scalings: Sequence[str], learning_rates: Sequence[float],
         seeds: Sequence[int]) -> Sweep:
  """Every scaling x learning rate x seed."""
  return Sweep(preset, lambda workdir: [
      point(preset, scaling, seed, {"learning_rate": lr})
      for scaling in scalings for lr in learning_rates for seed in seeds])


def seeds_first(preset: str, labels: Labels, seeds: Sequence[int]) -> Sweep:
  """Every label at each seed, seed-major (after the first seed every label has a run)."""
  return Sweep(preset, lambda workdir: [
      point(preset, scaling, seed, overrides, label=label)
      for seed in seeds for label, (scaling, overrides) in labels.items()])


def listed(preset: str, runs: Sequence[tuple]) -> Sweep:
  """The runs as listed: each (scaling, overrides, seeds[, label]) at every one of
  its seeds (with `label`: the label its runs declare)."""
  return Sweep(preset, lambda workdir: [
      point(preset, scaling, seed, overrides, **({"label": rest[0]} if rest else {}))
      for scaling, overrides, seeds, *rest in runs for seed in seeds])


def staged(preset: str, labels: Labels, starts: Mapping[str, int], *,
           bounds: tuple[int, int], more_seeds: Sequence[int] = (1, 2),
           band_seeds: Sequence[int] = (), transfer: Mapping[str, Sequence[str]] | None = None,
           window: int = 0, window_seeds: Sequence[int] = (),
           no_learning: float | None = None, eval_flags: Sequence[str] = (),
           declared: Mapping[str, str] | None = None) -> Sweep:
  """The staged learning-rate search over `labels` from 2^-starts[label]
  (`lr_search.points`; `band_seeds`: the study protocol; `window`: seed 0 at every
  rate within that many octaves of each best, `window_seeds` too; `eval_flags`:
  eval.py's flags for every point, e.g. `--lengths=...`; `declared`: the label a
  search's runs declare where it is not the search's own)."""
  def points(workdir):
    from attnscale.experiments import lr_search  # only the staged sweeps read results
    return lr_search.points(preset, labels, starts, workdir, bounds=bounds,
                            more_seeds=more_seeds, band_seeds=band_seeds, transfer=transfer,
                            no_learning=no_learning, window=window,
                            window_seeds=window_seeds, eval_flags=eval_flags,
                            declared=declared)
  return Sweep(preset, points)


def axis_search(preset: str, labels: Labels, field: str, values: Sequence[int],
                starts: Mapping[str, int], *, bounds: tuple[int, int], tag: str = "",
                base: int = 1, moves: Sequence[str] = (),
                start_at: Mapping[str, int] | None = None, more_seeds: Sequence[int] = (),
                band_seeds: Sequence[int] = (), window: int = 0,
                window_seeds: Sequence[int] = ()) -> Sweep:
  """`staged` over every (label, value of `field`): one search each, named
  "label@{tag}{value}", whose runs declare `label` (the value is their `field`).

  Each search starts at 2^-starts[label], moved one octave lower per doubling of
  the value above `base` for the labels in `moves` (e for 2^-e: starts[label] +
  round(log2(value / base))); `start_at` {label: e} replaces that at the largest
  value. The smallest value's best rate also runs at every other value
  (lr_search's `transfer`).
  """
  def name(label, value):
    return f"{label}@{tag}{value}"

  points = {name(label, v): (scaling, overrides | {field: v})
            for v in values for label, (scaling, overrides) in labels.items()}
  first = {name(label, v): starts[label]
           + (round(math.log2(v / base)) if label in moves else 0)
           for v in values for label in labels}
  first |= {name(label, values[-1]): e for label, e in (start_at or {}).items()}
  transfer = {name(label, values[0]): [name(label, v) for v in values[1:]] for label in labels}
  return staged(preset, points, first, bounds=bounds, more_seeds=more_seeds,
                band_seeds=band_seeds, transfer=transfer, window=window,
                window_seeds=window_seeds,
                declared={name(label, v): label for v in values for label in labels})


def sensitivity(preset: str, labels: Labels, best: Mapping[str, int], seeds: Sequence[int],
                *, top: int) -> Sweep:
  """Each label from two octaves below its best exponent up to 2^-top. Seed-major,
  and within a seed the highest rates first, every label at each: a sweep stopped
  early has every label where they differ most (and the diverging runs are the
  short ones)."""
  return Sweep(preset, lambda workdir: [
      point(preset, scaling, seed, {"learning_rate": 2.0**-e, **overrides}, label=label)
      for seed in seeds for e in range(top, max(best.values()) + 3)
      for label, (scaling, overrides) in labels.items() if e <= best[label] + 2])


def length(preset: str, lrs: Mapping[str, float], positions: Sequence[str], lengths: str,
           seeds: Sequence[int]) -> Sweep:
  """Each {scaling: learning rate} x positions x seed, then eval.py `lengths`; a run
  declares its scaling as its label (`labels.of_argument`: "log_n(s=1)"), the
  positions are its field.
  Seed-major: after the first seed, every (scaling, positions) has one run."""
  return Sweep(preset, lambda workdir: [
      point(preset, scaling, seed, {"learning_rate": lr, "model.positions": pos},
            eval=[lengths, "--length=100"], label=labels.of_argument(scaling))
      for seed in seeds for pos in positions for scaling, lr in lrs.items()])


def length_search(preset: str, baselines: Sequence[str], laws: Sequence[str],
                  gammas: Sequence[float], positions: Sequence[str], lengths: str,
                  seeds: Sequence[int], *, learning_rate: float, choose_at: int) -> Sweep:
  """`length` for length laws whose gamma is chosen on a held-out length.

  Stage 1, at seeds[0]: every baseline (a scaling) and every law (a scaling with
  its exponent, "log_n_power,p=1") at each gamma in `gammas`, per positions type;
  then the baselines at the other seeds. Stage 2, once a (law, positions) has all
  its gammas finished: the other seeds at its best gamma, the lowest seeds[0]
  validation loss at length `choose_at` (eval.json's; a diverged run counts as
  worst). `choose_at` should be neither the training length nor a length the
  study reports, so the choice is not fitted to what it is judged on. Each run
  declares its scaling argument as its label (`labels.of_argument`:
  "log_n_power(gamma=0.5,p=1)").
  """
  def run(scaling, seed, pos):
    return point(preset, scaling, seed, {"learning_rate": learning_rate,
                                         "model.positions": pos},
                 eval=[lengths, "--length=100"], label=labels.of_argument(scaling))

  def law(name, gamma):
    return f"{name},gamma={gamma:g}"

  def held_out_loss(workdir, p) -> float | None:
    from attnscale.experiments import run_records, sweeps  # stage 2 reads results
    run_dir = os.path.join(workdir, sweeps.Point(
        p["arg"], tuple(sorted(p["overrides"].items()))).name)
    if not os.path.exists(os.path.join(run_dir, "config.json")):
      return None
    if run_records.status(run_dir, read_checkpoint=False) == "diverged":
      return math.inf
    if not run_records.evaluated(run_dir):
      return None
    with open(os.path.join(run_dir, "eval.json")) as f:
      return json.load(f)["lengths"][str(choose_at)]["val_loss"]

  def points(workdir):
    first = [run(s, seeds[0], pos) for pos in positions
             for s in [*baselines, *(law(n, g) for n in laws for g in gammas)]]
    first += [run(s, seed, pos) for seed in seeds[1:] for pos in positions for s in baselines]
    second = []
    for pos in positions:
      for name in laws:
        losses = [held_out_loss(workdir, run(law(name, g), seeds[0], pos))
                  if workdir else None for g in gammas]
        if None in losses:
          continue
        best = gammas[losses.index(min(losses))]
        second += [run(law(name, best), seed, pos) for seed in seeds[1:]]
    return first + second
  return Sweep(preset, points)


def precision(preset: str, scalings: Sequence[str], formats: Mapping[str, dict],
              seeds: Mapping[int, Sequence[str]],
              lrs: Mapping[str, float] | None = None) -> Sweep:
  """Each scaling x format ({label: overrides}) x seed ({seed: its formats}), at
  `lrs[scaling]` (None: the preset's rate); a run declares its scaling as its label
  (the format is its fields)."""
  def lr(scaling):
    return {"learning_rate": lrs[scaling]} if lrs else {}
  return Sweep(preset, lambda workdir: [
      point(preset, scaling, seed, lr(scaling) | formats[f], label=labels.of_argument(scaling))
      for seed, seed_formats in seeds.items() for scaling in scalings for f in seed_formats])
