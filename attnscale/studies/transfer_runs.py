"""The transfer sweep's runs (configs/shakespeare_char_sweeps.py `transfer` and its companions):
each run's label (the one its sweep declared in config.label; `transfer_label` derives it
for a run made without one), the finished runs of one or several workdirs as rows,
and per label and size the losses {log2 rate: {seed: final loss}} the transfer,
width and depth studies read (attnscale/studies/transfer.py, transfer_sensitivity.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import numpy as np

from attnscale.config import labels
from attnscale.experiments import reporting, stats
from attnscale.studies import sensitivity as sensitivity_study

# The sweep's labels (configs/shakespeare_char_sweeps.py TRANSFER_LABELS), in its order.
LABELS = tuple(f"{p}_{o}_{a}" for p, o in (("sp", "adam"), ("mup", "adam"), ("sp", "muon"))
               for a in ("standard", "qk_rmsnorm", "cosine")) + (
                   "umup", "sp_muon_qk_clip", "sp_adam_inverse_d", "sp_adam_unit_scaled")
QK_CLIP = 50.0  # the sweep's tau, which its label leaves unsaid
TOL = 1e-9  # log2 rate: an interval "covers" a slope up to float round-off
MUP_MULTS = ("mup_output_mult", "mup_attn_mult")  # muP's base multipliers, 1 unless searched


def transfer_label(config: Mapping) -> str:
  """The sweep's label of a run that declares none (made by hand, or by a sweep
  before labels were declared), from its config.json (`LABELS`). Every committed run
  declares its label, and each equals this (checked when they were backfilled).

  "{parameterization}_{adam|muon}_{scaling}" ("mup_adam_cosine"; the unit-scaled
  model, fully scaled attention in the unit variant, is "unit_scaled"); "umup" for u-muP
  (u-muP's attention and residual rule; "umup_<scaling>_<residual>" otherwise);
  QK-clip appends "_qk_clip" (tau 50; "_qk_clip<tau>" at another) in place of
  "_standard"; muP's base multipliers other than 1 append "_output<m>" / "_attn<m>"
  (configs/shakespeare_char_sweeps.py MUP_MULT_LABELS), and `model.mup_vector_lr` other than
  "constant" "_vector_lr_<value>"; Muon's AdamW branch at a rate of its own appends
  "_adam_lr<m>" (muon_adam_lr_mult) and "_adam_per_width<B>" (muon_adam_lr_base_width).
  Adam and AdamW are "adam" (the sweep's Adam is AdamW with decay 0).
  A run with anything else that changes attention (its `labels.run_label` says
  more than these fields do) keeps its run_label: never averaged into a sweep label.
  """
  import ml_collections

  model = config["model"]
  param, scaling = model.get("parameterization", "sp"), model["scaling"]
  optimizer = "muon" if config.get("optimizer") == "muon" else "adam"
  clip = config.get("qk_clip") or 0.0
  attention = {"scaling": scaling, "variant": model.get("variant", "standard"),
               "unit": model.get("unit", {})}
  if param == "umup":
    residual = attention["unit"].get("attn_residual", "")
    label = ("umup" if (scaling, residual) == ("umup", "rule") else
             f"umup_{scaling}_{residual}") + ("_muon" if optimizer == "muon" else "")
  else:  # the attention's run_label: the scaling, or "unit_scaled" for Graphcore's model
    name = labels.run_label(ml_collections.ConfigDict({"model": attention}))
    label = f"{param}_{optimizer}_{name}"
  if clip:
    label = label.removesuffix("_standard") + ("_qk_clip" if clip == QK_CLIP
                                               else f"_qk_clip{clip:g}")
  adam_mult = config.get("muon_adam_lr_mult", 1.0)
  base_width = config.get("muon_adam_lr_base_width", 0)
  if optimizer == "muon":  # the AdamW branch's rate, decoupled
    label += (f"_adam_lr{adam_mult:g}" if adam_mult != 1 else "") + (
        f"_adam_per_width{base_width}" if base_width else "")
  mults = {name: model[name] for name in MUP_MULTS if model.get(name, 1.0) != 1}
  for name, value in mults.items():  # muP's base multipliers (the mup_mults sweep)
    label += f"_{name.removeprefix('mup_').removesuffix('_mult')}{value:g}"
  vector_lr = model.get("mup_vector_lr", "constant")
  if vector_lr != "constant":  # the mup_vector_lr ablation
    mults = mults | {"mup_vector_lr": vector_lr}
    label += f"_vector_lr_{vector_lr}"
  known = {"model": attention | {"parameterization": param} | mults, "qk_clip": clip,
           "optimizer": config.get("optimizer"), "muon_adam_lr_mult": adam_mult,
           "muon_adam_lr_base_width": base_width}
  full = labels.run_label(ml_collections.ConfigDict(config))
  return label if full == labels.run_label(ml_collections.ConfigDict(known)) else full


def read_rows(workdir: str) -> list[dict]:
  """The sweep's finished (or diverged) runs (`sensitivity.read_rows`), each with its
  label, width, vocabulary, (step, largest logit over layers) curve and that curve's
  peak."""
  rows = sensitivity_study.read_rows(workdir, lambda config: {
      "label": config.get("label") or transfer_label(config),
      "width": config["model"]["width"]})
  for row in rows:
    peak = [v for _, v in row["logits"] if math.isfinite(v)]
    row["max_logit_peak"] = max(peak) if peak else math.nan
  return _sorted(rows)


def read_workdirs(workdirs: Sequence[str], labels: str | None = None) -> list[dict]:
  """`read_rows` of each workdir in turn (a run name met again is the first one's: the
  same run copied into two folders counts once), then only the labels `labels` (a
  regular expression, `re.search`) matches."""
  rows, seen = [], set()
  for workdir in workdirs:
    for row in read_rows(workdir):
      if row["run"] not in seen:
        seen.add(row["run"])
        rows.append(row)
  if labels:
    rows = [r for r in rows if re.search(labels, r["label"])]
  return _sorted(rows)


def _sorted(rows: Sequence[dict]) -> list[dict]:
  """Rows in the tables' order: label (the sweep's first), width, rate, seed."""
  order = {k: i for i, k in enumerate(labels_of(rows))}
  return sorted(rows, key=lambda r: (order[r["label"]], r["width"], r["learning_rate"],
                                     r["seed"]))


def labels_of(rows: Sequence[dict]) -> list[str]:
  """The rows' labels: the sweep's in its order, then any other, sorted."""
  present = {r["label"] for r in rows}
  return [k for k in LABELS if k in present] + sorted(present - set(LABELS))


def widths_of(rows: Sequence[dict], label: str, axis: str = "width") -> list[int]:
  """The sizes of `label` on `axis` ("width"; the depth study: "depth")."""
  return sorted({r[axis] for r in rows if r["label"] == label})


def losses(rows: Sequence[dict], label: str, width: int, axis: str = "width"
           ) -> dict[float, dict[int, float]]:
  """{log2 rate: {seed: final loss}} of one label and size (NaN: diverged)."""
  out: dict[float, dict[int, float]] = {}
  for r in rows:
    if r["label"] == label and r[axis] == width:
      out.setdefault(math.log2(r["learning_rate"]), {})[r["seed"]] = r["final_train_loss"]
  return out


def seed_means(by_rate: Mapping[float, Mapping[int, float]]) -> dict[float, float]:
  """{log2 rate: seed mean}, NaN where any seed diverged (the search's rule)."""
  return {x: float(np.mean(list(s.values()))) if all(map(math.isfinite, s.values()))
          else math.nan for x, s in by_rate.items()}


def best_rate(by_rate: Mapping[float, Mapping[int, float]]) -> tuple[float, float]:
  """(grid, interpolated) best log2 rate on the seed means; NaN, NaN if all diverged."""
  return stats.parabola_vertex(seed_means(by_rate))


def cell_rates(xs) -> str:
  return " ".join(reporting.power_of_two(2.0**x) for x in sorted(xs))
