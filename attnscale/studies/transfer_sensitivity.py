"""Wortsman et al.'s learning-rate sensitivity across width, for the transfer study
(attnscale/studies/transfer.py) on its sweeps' rows (transfer_runs.py).

Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities" (arXiv 2309.14322, section 3.1), `attnscale.studies.sensitivity.sensitivity`
per seed:

    S = mean_lr min(L(lr), L_0) - min_lr L(lr),   L_0 = ln V (a diverged run: L_0)

Wortsman et al. take the mean over one fixed range of rates at every size; here
each label and width has its own best, so S is over a fixed range relative to it:
the whole-octave rates within WINDOW (2) octaves of the best and contiguous with it
(no gap wider than an octave). The sweep runs seed 0 at all five of them
(lr_search's `window`); a rate outside (the transfer run, set apart several octaves
from an sp search at a large width, or the far end of a long search) is left out
(`left_out`), as it would put a far rate into one width's mean and not another's.
Where the window is not complete yet (`rates` < 5: the sweep is still running, or a
bound cut it) S is over fewer rates, so read S across widths with `rates` beside it.
The mean and t-interval are over the seeds that ran the same rates as seed 0; where
fewer than 2 did (the protocol's seeds 1 and 2 run only the band), seed 0 alone
(`basis`). S's slope against log2(width):
least squares over the widths, 95% t-interval with n - 2 degrees of freedom (the
widths' scatter about the line; each S's own seed noise only as far as that scatter
shows it: none with 2 widths); `seed_slope` is the same line through every seed's S,
so each width's seed spread enters its interval. Wortsman et al. find S grows with
size under standard attention, and QK-layernorm reduces it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from attnscale.experiments import reporting, stats
from attnscale.studies.sensitivity import sensitivity
from attnscale.studies.transfer_runs import TOL, best_rate, cell_rates, labels_of, losses, widths_of

# Octaves each side of the best that S averages over (the transfer sweep's window).
WINDOW = 2


def _contiguous(xs: Sequence[float], around: float) -> list[float]:
  """The rates of `xs` joined to `around` with no gap wider than one octave."""
  xs = sorted(xs)
  if around not in xs:
    return xs
  i = j = xs.index(around)
  while i > 0 and xs[i] - xs[i - 1] <= 1 + TOL:
    i -= 1
  while j < len(xs) - 1 and xs[j + 1] - xs[j] <= 1 + TOL:
    j += 1
  return xs[i:j + 1]


def _window(rows: Sequence[dict], label: str, w: int):
  """(by_rate, grid best, L0, each seed's window rates, the seeds whose window is seed
  0's (the first seed's), {seed: S} of those seeds)."""
  by_rate = losses(rows, label, w)
  grid, _ = best_rate(by_rate)
  init = math.log(next(r["vocab_size"] for r in rows if r["label"] == label))
  seeds = sorted({s for v in by_rate.values() for s in v})
  block = {s: [x for x in _contiguous([x for x, v in by_rate.items() if s in v], grid)
               if abs(x - grid) <= WINDOW + TOL] for s in seeds}
  same = [s for s in seeds if block[s] == block[seeds[0]]]
  per_seed = {s: sensitivity([by_rate[x][s] for x in block[s]], init) for s in same}
  return by_rate, grid, init, block, same, per_seed


def seed_sensitivities(rows: Sequence[dict]) -> dict[tuple[str, int], dict[int, float]]:
  """{(label, width): {seed: S}} over the seeds that ran seed 0's window (none where
  every rate diverged)."""
  out = {}
  for label in labels_of(rows):
    for w in widths_of(rows, label):
      _, grid, _, _, _, per_seed = _window(rows, label, w)
      out[label, w] = per_seed if math.isfinite(grid) else {}
  return out


def sensitivity_rows(rows: Sequence[dict]) -> list[dict]:
  """Per label and width: S over the rates within WINDOW octaves of the best and
  contiguous with it (module docstring)."""
  out = []
  for label in labels_of(rows):
    for w in widths_of(rows, label):
      by_rate, grid, init, block, same, per_seed = _window(rows, label, w)
      first = same[0]
      if not math.isfinite(grid):  # S = L0 - L0 = 0 would read as insensitive
        value, basis = stats.mean_interval([]), "every rate diverged"
      elif len(same) >= 2:
        value = stats.mean_interval(per_seed.values())
        basis = f"{len(same)} seeds"
      else:
        value = stats.Interval(per_seed[first], math.nan, math.nan, 1, math.nan)
        basis = f"seed {first} (the other seeds ran other rates)"
      seed_rates = [x for x, v in by_rate.items() if first in v]
      out.append({"label": label, "width": w, "rates": len(block[first]),
                  "rate_range": f"{cell_rates(block[first][:1])} ... "
                                f"{cell_rates(block[first][-1:])}",
                  "left_out": len(seed_rates) - len(block[first]),
                  "diverged": sum(not math.isfinite(by_rate[x][first]) for x in block[first]),
                  "S": value.mean, "S_lo": value.lo, "S_hi": value.hi, "seeds": len(same),
                  "basis": basis, "L0": init})
  return out


def _line(x_N, y_N) -> tuple[float, float, float, str]:
  """Least squares of y on x: (slope, lo, hi, reading), a 95% t-interval on n - 2
  degrees of freedom (NaN, and a reading that says why, with fewer than 3 points)."""
  if len(x_N) < 2 or len(set(x_N)) < 2:
    return math.nan, math.nan, math.nan, "fewer than 2 widths"
  x_N, y_N = np.asarray(x_N, float), np.asarray(y_N, float)
  slope, intercept = np.polyfit(x_N, y_N, 1)
  if len(x_N) == 2:
    return float(slope), math.nan, math.nan, "no interval with 2 widths"
  resid_N = y_N - (slope * x_N + intercept)
  se = math.sqrt(np.sum(resid_N**2) / (len(x_N) - 2) / np.sum((x_N - x_N.mean())**2))
  half = stats.t_multiplier(len(x_N) - 2) * se
  reading = ("grows with width" if slope - half > 0 else
             "falls with width" if slope + half < 0 else "flat within noise")
  return float(slope), float(slope - half), float(slope + half), reading


def sensitivity_slope_rows(table: Sequence[dict], per_seed: Mapping | None = None,
                           reference: str | None = None) -> list[dict]:
  """Per label: least squares of S on log2(width) with its 95% t-interval (n - 2 df),
  through the per-width means; with `per_seed` ({(label, width): {seed: S}},
  `seed_sensitivities`) also through every seed's S ("seed_*": n = all those points,
  so each width's seed spread enters the interval, not only the means' scatter; seeds
  taken as independent draws across widths); with `reference` too, through every
  seed's S minus the reference's S on the same seed and width ("vs_*": does the gap
  between the two grow with width? Wortsman et al.'s claim for QK-layernorm against
  standard attention is that it does, in QK-layernorm's favour: a negative slope)."""
  out = []
  for label in dict.fromkeys(r["label"] for r in table):
    pts = [r for r in table if r["label"] == label and math.isfinite(r["S"])]
    slope, lo, hi, reading = _line(np.log2([r["width"] for r in pts]), [r["S"] for r in pts])
    row = {"label": label, "widths": len(pts), "slope": slope, "lo": lo, "hi": hi,
           "reading": reading}
    if per_seed is not None:
      xy = [(math.log2(r["width"]), v) for r in pts
            for v in per_seed.get((label, r["width"]), {}).values() if math.isfinite(v)]
      s_slope, s_lo, s_hi, s_reading = _line([x for x, _ in xy], [y for _, y in xy])
      row.update(seed_points=len(xy), seed_slope=s_slope, seed_lo=s_lo, seed_hi=s_hi,
                 seed_reading=s_reading)
    if per_seed is not None and reference is not None and label == reference:
      row.update(vs_points=0, vs_slope=math.nan, vs_lo=math.nan, vs_hi=math.nan,
                 vs_reading="the reference")  # every table row has the same columns
    elif per_seed is not None and reference is not None:
      xd = [(math.log2(r["width"]), v - ref[s]) for r in pts
            for ref in [per_seed.get((reference, r["width"]), {})]
            for s, v in per_seed.get((label, r["width"]), {}).items()
            if s in ref and math.isfinite(v) and math.isfinite(ref[s])]
      v_slope, v_lo, v_hi, v_reading = _line([x for x, _ in xd], [y for _, y in xd])
      row.update(vs_points=len(xd), vs_slope=v_slope, vs_lo=v_lo, vs_hi=v_hi,
                 vs_reading=v_reading)
    out.append(row)
  return out


def sensitivity_versus_rows(rows: Sequence[dict], reference: str,
                            per_seed: Mapping | None = None) -> list[dict]:
  """Each label's S against `reference`'s at every width both have, b minus a with
  `stats.compare` on the seeds' S (`per_seed`, `seed_sensitivities(rows)` unless given:
  paired on the shared seeds, as the sweep's labels share seeds 0, 1, 2): whether one
  attention is less sensitive than another at that width, with the interval that
  claim needs."""
  per_seed = seed_sensitivities(rows) if per_seed is None else per_seed
  mean = lambda by_seed: float(np.mean(list(by_seed.values()))) if by_seed else math.nan
  out = []
  for label in labels_of(rows):
    for w in widths_of(rows, label):
      if label == reference or (reference, w) not in per_seed:
        continue
      c = stats.compare(per_seed[reference, w], per_seed[label, w])
      out.append({"label": label, "width": w, "reference": reference,
                  "S": mean(per_seed[label, w]), "reference_S": mean(per_seed[reference, w]),
                  "effect": c.effect, "lo": c.lo, "hi": c.hi, "n": c.n, "method": c.method,
                  "verdict": c.verdict})
  return out


def plot_sensitivity(table: Sequence[dict]):
  fig = reporting.new_figure(8, 5)
  ax = fig.subplots()
  for i, label in enumerate(dict.fromkeys(r["label"] for r in table)):
    pts = [r for r in table if r["label"] == label]
    s = np.array([r["S"] for r in pts])
    err = np.nan_to_num([s - [r["S_lo"] for r in pts], [r["S_hi"] for r in pts] - s])
    ax.errorbar([r["width"] * (1 + 0.02 * (i - 5)) for r in pts], s, yerr=err, capsize=2,
                label=label, **reporting.style(i))
  ax.set_xscale("log", base=2)
  reporting.label_axes(ax, xlabel="width", ylabel="learning-rate sensitivity S (nats)",
                       title="Wortsman et al.'s S against width; bars: 95% t where seeds allow")
  ax.legend(fontsize=7, ncol=2)
  return fig


def tables(rows: Sequence[dict], reference: str) -> dict[str, list[dict]]:
  """The three sensitivity tables by file name: S per label and width, its slopes on
  log2(width), and each label's S against `reference`'s (each seed's S computed once)."""
  sens, per_seed = sensitivity_rows(rows), seed_sensitivities(rows)
  return {"transfer_sensitivity": sens,
          "transfer_sensitivity_slopes": sensitivity_slope_rows(sens, per_seed, reference),
          "transfer_sensitivity_versus": sensitivity_versus_rows(rows, reference, per_seed)}


def write_tables(tables: Mapping[str, list[dict]], out: str, code: str,
                 reference: str) -> list[str]:
  """`tables` (tables(rows, reference)) as transfer_sensitivity.md/csv,
  transfer_sensitivity_slopes.md/csv, transfer_sensitivity_versus.md/csv and
  transfer_sensitivity.png in `out`; the paths written."""
  sens = tables["transfer_sensitivity"]
  paths = reporting.write_tables(
      sens, out, "transfer_sensitivity", floats=".3f",
      title="Learning-rate sensitivity against width",
      notes=["S: Wortsman et al.'s mean over rates of min(L, L0) minus the best, L0 = ln V "
             f"(diverged = L0), per seed over the rates within {WINDOW} octaves of the best "
             "and contiguous with it (left_out: that seed's other rates, e.g. a transfer "
             "run); [S_lo, S_hi]: 95% t over the seeds with seed 0's rates, else seed 0 "
             f"alone (basis). rates < {2 * WINDOW + 1}: the window is not complete (sweep "
             "running, or a bound), so compare widths with `rates` beside.", code])
  paths += reporting.write_tables(
      tables["transfer_sensitivity_slopes"], out,
      "transfer_sensitivity_slopes", floats=".3f",
      title="Sensitivity against width: slopes",
      notes=["slope: least squares of S (the seed mean) on log2 width; lo/hi: its 95% "
             "t-interval (n - 2 degrees of freedom: the widths' scatter about the line). "
             "seed_slope: the same line through every seed's S (seed_points of them), so "
             "the seeds' spread at each width enters seed_lo/seed_hi (seeds taken as "
             f"independent across widths). vs_slope: the same line through each seed's S "
             f"minus {reference}'s on that seed and width (vs_points of them): negative, "
             f"the label's S falls behind {reference}'s as the width grows.", code])
  paths += reporting.write_tables(
      tables["transfer_sensitivity_versus"], out, "transfer_sensitivity_versus",
      floats=".3f", title=f"Each label's sensitivity S against {reference}'s",
      notes=[f"effect: the label's S minus {reference}'s at the same width (negative: less "
             "sensitive); [lo, hi]: 95% t, paired by seed on the seeds that ran each one's "
             "whole window (attnscale.experiments.stats.compare), Welch's where fewer than "
             "2 are shared, none where a side has one seed; verdict: worse (more "
             "sensitive) / better where the interval excludes 0.", code])
  paths.append(reporting.save_figure(plot_sensitivity(sens), out, "transfer_sensitivity"))
  return paths
