"""The transfer study in one line per label (transfer_summary.md/csv): what a reader
needs first, read off the study's other tables (attnscale/studies/transfer.py), so
it is current whenever they are.

  widths       the widths with a best
  best         the grid best at each of them, in width order
  unfinished   the widths whose search the protocol has not finished, and why
               (`unfinished_widths`), "-" when none
  slope        log2(best rate) on log2(width), bootstrap interval (transfer_slopes)
  reading      transfer_slopes' reading of that interval
  transfer     at the largest width: the loss at the smallest width's best rate
               minus this width's own best, [95% t] where paired (transfer.md)
  loss         at the largest width's best: mean [95% t] over its seeds
  vs_reference at the largest width: the loss at the best minus the reference's at
               its own best, paired by seed [95% t] (transfer_versus)
  S_slope      Wortsman et al.'s S on log2(width) through every seed's S, 95% t
               (transfer_sensitivity_slopes' seed_slope), and its reading

A number with no interval rests on seed 0 alone (or on too few widths); the
columns name their basis. The summary claims nothing its source tables do not.

The transfer page's at-a-glance table (docs/experiments/transfer.md) is this table
with the sweep's labels named for people; print it from the committed CSV with

    python -m attnscale.studies.transfer_summary docs/results/transfer/transfer_summary.csv
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Mapping, Sequence

from attnscale.experiments import reporting, stats
from attnscale.studies.transfer_runs import losses

WIDTHS = (32, 64, 128, 256)  # the transfer sweep's (configs/shakespeare_char_sweeps.py)
PAGE_NAMES = {  # label -> its row name on the transfer page, in the page's order
    "sp_adam_standard": "sp + Adam, standard", "sp_adam_qk_rmsnorm": "sp + Adam, RMS QK-norm",
    "sp_adam_cosine": "sp + Adam, cosine", "mup_adam_standard": "muP + Adam, standard",
    "mup_adam_qk_rmsnorm": "muP + Adam, RMS QK-norm", "mup_adam_cosine": "muP + Adam, cosine",
    "sp_muon_standard": "sp + Muon, standard", "sp_muon_qk_rmsnorm": "sp + Muon, RMS QK-norm",
    "sp_muon_cosine": "sp + Muon, cosine", "umup": "u-muP",
    "sp_muon_qk_clip": "sp + Muon + QK-clip, standard",
    "sp_adam_inverse_d": "control: sp + Adam, 1/d",
    "sp_adam_unit_scaled": "control: unit-scaled, one Adam rate"}


def unfinished_widths(rows: Sequence[dict], table: Sequence[dict], label: str
                      ) -> dict[int, str]:
  """{width: why} for the widths of `label` whose search the study protocol has not
  finished: no best yet, the best not bracketed (an octave either side of it not
  both run; a diverged neighbour counts, and a best at the search's bound reads as
  unbracketed too), fewer than stats.MIN_SEEDS seeds at the best, or band rates
  short of seeds (`band_short` of them: a rate with seed 0 alone cannot be shown
  worse, so it stays in the band until its seeds run)."""
  out = {}
  for r in table:
    if r["label"] != label:
      continue
    grid = r["best_log2_lr"]
    rates = losses(rows, label, r["width"]).keys()
    why = ("no best" if not math.isfinite(grid) else
           "not bracketed" if not (grid - 1 in rates and grid + 1 in rates) else
           f"{r['seeds']} seed{'s' * (r['seeds'] != 1)} at the best" if r["seeds"] < stats.MIN_SEEDS else
           f"{r['band_short']} band rate{'s' * (r['band_short'] > 1)} short of seeds"
           if r["band_short"] else "")
    if why:
      out[r["width"]] = why
  return out


def _interval(x: float, lo: float, hi: float, digits: int = 3, sign: str = "+") -> str:
  if not math.isfinite(x):
    return "-"
  f = f"{sign}.{digits}f"
  if not (math.isfinite(lo) and math.isfinite(hi)):
    return format(x, f)
  return f"{x:{f}} [{lo:{f}}, {hi:{f}}]"


def summary_rows(rows: Sequence[dict], table: Sequence[dict], slopes: Sequence[dict],
                 versus: Sequence[dict], sensitivity_slopes: Sequence[dict],
                 reference: str) -> list[dict]:
  """One row per label of `table` (transfer.table_rows), from the study's slope,
  versus and sensitivity-slope rows; the module docstring says what each column is."""
  slope_of = {r["label"]: r for r in slopes}
  s_slope_of = {r["label"]: r for r in sensitivity_slopes}
  out = []
  for label in dict.fromkeys(r["label"] for r in table):
    cells = [r for r in table if r["label"] == label and math.isfinite(r["best_log2_lr"])]
    if not cells:
      continue
    last = cells[-1]
    w = last["width"]
    fit, sens = slope_of.get(label, {}), s_slope_of.get(label, {})
    vs = next((r for r in versus if r["label"] == label and r["width"] == w), None)
    basis = last["transfer_basis"]
    transfer = (f"0 ({basis})" if last["transfer_loss"] == 0 else basis
                if not math.isfinite(last["transfer_loss"]) else
                _interval(last["transfer_loss"], last["transfer_lo"], last["transfer_hi"],
                          sign="") + (" seed 0" if basis == "seed 0" else ""))
    unfinished = unfinished_widths(rows, table, label)
    out.append({
        "label": label,
        "widths": " ".join(str(r["width"]) for r in cells),
        "best": " ".join(reporting.power_of_two(r["best_lr"]) for r in cells),
        "unfinished": "; ".join(f"{w_}: {why}" for w_, why in unfinished.items()) or "-",
        "slope": _interval(fit.get("slope", math.nan), fit.get("lo", math.nan),
                           fit.get("hi", math.nan), digits=2),
        "reading": fit.get("reading", "-"),
        "at_width": w,
        "transfer": transfer,
        "loss": _interval(last["loss"], last["loss_lo"], last["loss_hi"], sign=""),
        "vs_reference": ("the reference" if label == reference else "-" if vs is None else
                         _interval(vs["effect"], vs["lo"], vs["hi"])),
        "S_slope": _interval(sens.get("seed_slope", math.nan), sens.get("seed_lo", math.nan),
                             sens.get("seed_hi", math.nan)),
        "S_reading": (sens.get("seed_reading", "-") + (
            " (seed 0 alone)" if math.isfinite(sens.get("seed_slope", math.nan))
            and sens["seed_points"] <= sens["widths"] else "")),
    })
  return out


def write_summary(rows: Sequence[dict], table: Sequence[dict], slopes: Sequence[dict],
                  versus: Sequence[dict], sensitivity_slopes: Sequence[dict], out: str,
                  code: str, reference: str) -> list[str]:
  """transfer_summary.md/csv in `out`; the paths written."""
  return reporting.write_tables(
      summary_rows(rows, table, slopes, versus, sensitivity_slopes, reference), out,
      "transfer_summary", title="Transfer across width: one line per label",
      notes=["best: the grid best (lowest seed mean) at each width; unfinished: widths "
             "where the best is not bracketed (no run an octave either side), has fewer "
             f"than {stats.MIN_SEEDS} seeds, or a band rate is short of seeds (the protocol's search "
             "still running there); slope: "
             "log2 best rate on log2 width [bootstrap 95% over seeds] (transfer_slopes.md). "
             "At the largest width (at_width): transfer, the loss at the smallest width's "
             "best rate minus the best's [95% t, paired] or seed 0 alone; loss, mean [95% t] "
             f"at the best; vs_reference, the loss at the best minus {reference}'s at its "
             "own best [95% t, paired by seed] (transfer_versus.md). S_slope: the "
             "sensitivity S on log2 width through every seed's S [95% t] "
             "(transfer_sensitivity_slopes.md's seed_slope); seed 0 where the label's "
             "window has seed 0 alone.", code])


def page_table(summary: Mapping[str, Mapping[str, str]]) -> str:
  """The transfer page's at-a-glance table from transfer_summary.csv's rows by label
  (strings, as csv.DictReader reads them): PAGE_NAMES' labels in order; a label not
  run at every one of WIDTHS yet says so in its `unfinished` cell."""
  lines = ["| label | best rate at " + ", ".join(map(str, WIDTHS)) + " | slope [95%] | tuned "
           "at 32: cost at the largest width | loss at the largest width's best | minus "
           "sp + Adam's there (paired) | S per doubling [95%] | unfinished |",
           "|---|---|---|---|---|---|---|---|"]
  for label, name in PAGE_NAMES.items():
    r = summary[label]
    at = "" if int(r["at_width"]) == WIDTHS[-1] else f" (at {r['at_width']})"
    s_slope = r["S_slope"] + (" (seed 0)" if "seed 0" in r["S_reading"] else "")
    unfinished = r["unfinished"] if not at else (
        ("" if r["unfinished"] == "-" else r["unfinished"] + "; ")
        + f"{WIDTHS[-1]}: not run yet")
    lines.append(f"| {name} | {r['best']} | {r['slope']} | {r['transfer']}{at} | {r['loss']} | "
                 f"{r['vs_reference']} | {s_slope} | {unfinished} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  with open(sys.argv[1]) as f:
    print(page_table({r["label"]: r for r in csv.DictReader(f)}), end="")
