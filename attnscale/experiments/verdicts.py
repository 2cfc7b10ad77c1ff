"""A study's comparisons against its baseline read under the protocol's two rules
(docs/guides/sweeps.md, "Verdicts that hold"): tie-robust and family-wise.

    ties_cell(losses, best)        a label's tie set, "2^-9 2^-8" (stats.tie_set)
    robust(a, b, ...)              the verdict over every pairing of two tie sets
                                   (stats.robust_compare), one cell
    one_rate(a, b)                 "untested: one rate each (2^-9)" where neither label
                                   ran a second rate, so no tie set can be measured
    family(comparisons)            Holm-adjusted p and the family-wise verdict of each
                                   comparison against the baseline, one cell each
    resolution_note(...)           "the smallest difference this design resolves"

Every study that compares labels against one baseline at each one's best rate
builds its columns here, so the rules are written once (attnscale/experiments/stats.py)
and read the same on every page.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

from attnscale.experiments import stats

ByRate = Mapping[float, Mapping[Hashable, float]]  # {rate: {seed: value}}


def rate_label(rate: float) -> str:
  """2^-8 for 0.00390625; the rate itself where it is not a power of 2."""
  if rate > 0 and float(math.log2(rate)).is_integer():
    return f"2^{int(math.log2(rate))}"
  return f"{rate:g}"


def ties_cell(losses: ByRate, best: float) -> str:
  """The tie set of `best` among `losses` (the selection measure), as rates."""
  return " ".join(rate_label(r) for r in stats.tie_set(losses, best))


def robust(a_measure: ByRate, b_measure: ByRate, a_ties: Sequence[float],
           b_ties: Sequence[float], higher_is_better: bool = False) -> str:
  """b against a on a measure at every pairing of the two tie sets: the verdict
  where all agree, else "depends on the rate chosen (k of n: ...)"; "" without runs."""
  a_ties = [r for r in a_ties if a_measure.get(r)]
  b_ties = [r for r in b_ties if b_measure.get(r)]
  if not a_ties or not b_ties:
    return ""
  return stats.robust_compare(a_measure, b_measure, a_ties, b_ties).format(higher_is_better)


def one_rate(*measures: ByRate) -> str:
  """The robust cell of a study that ran each label at one rate (chosen by another
  sweep): "untested: one rate each (2^-9 2^-5)", the rates run; "" where some label
  ran two or more, so that `robust` can be read. A single rate is its own tie set,
  and the verdict there would read as tie-robust without any evidence that it is."""
  ran = [[r for r, v in m.items() if v] for m in measures]
  if any(len(rates) > 1 for rates in ran):
    return ""
  rates = sorted({r for rates in ran for r in rates})
  return f"untested: one rate each ({' '.join(rate_label(r) for r in rates)})"


def family(comparisons: Mapping[Hashable, stats.Comparison],
           higher_is_better: bool = False) -> dict:
  """Holm over the family (every label's comparison against the baseline on one
  measure): {label: cell}, the adjusted p, with the verdict where it survives
  ("0.012 worse") and alone where the family reads it within noise ("0.303")."""
  labels = list(comparisons)
  adjusted = stats.holm([comparisons[k].p for k in labels])
  out = {}
  for k, p in zip(labels, adjusted):
    word = stats.holm_verdict(comparisons[k], p, higher_is_better)
    out[k] = "" if not math.isfinite(p) else f"{p:.3f}" + (
        "" if word == "within noise" else f" {word}")
  return out


def resolution_note(name: str, comparisons: Sequence[stats.Comparison], unit: str) -> str:
  """One note line: the median half-width of a family's intervals."""
  r = stats.resolution(comparisons)
  return (f"{name}: the smallest difference this design resolves is about {r:.3f} {unit} "
          f"(the median half-width of its {len(comparisons)} intervals)")


def by_rate(runs: Sequence[dict], value: Callable[[dict], float]) -> dict[float, dict]:
  """{rate: {seed: value}} of finished runs (`learning_rate`, `seed`, `status`)."""
  out: dict[float, dict] = {}
  for r in runs:
    if r.get("status", "done") == "done":
      out.setdefault(r["learning_rate"], {})[r["seed"]] = value(r)
  return out
