"""The shared key/value study: W_K = W_V against separate projections.

    python -m attnscale.studies shared_kv --out DIR --workdirs runs/shared_kv [runs/shared_kv_cpu]
    python -m attnscale.studies shared_kv --out DIR --workdirs docs/results/shared_kv/runs.parquet/raw \
        --weights runs/shared_kv_best   # an archive; sweep.py --retrain_best_to's weights

Reads the `shared_kv` sweep (configs/shakespeare_char_sweeps.py: each scaling with separate and
shared projections, plus the parameter-matched control, grouped-query attention
with 2 key/value heads, which has exactly shared K/V's attention parameters with
keys and values untied) and, optionally, the `shared_kv_cpu` sweep (the larger
model, three seeds at the cpu preset's rate). Writes:

  shared_kv.md/csv   per scaling: separate vs shared (vs control) at each one's best
                     rate, mean ± s.e. over seeds, the difference and whether it is
                     within noise (`stats.compare`: paired by seed, a 95% t-interval),
                     parameters, and the train/validation gap
  shared_kv_diag.*   the seed-0 best run of each label: eval.py's attention
                     diagnostics and `diagnostics.value_alignment` (weight on self,
                     correlation of a key's weight with cos(q, v) and cos(v_i, v_j)),
                     means over layers and heads
  shared_kv.png      loss against learning rate, separate and shared per scaling,
                     and the value-alignment measures per label
  shared_kv_cpu.*    the cpu preset's runs, when its workdir is given

The train/validation gap is the best validation loss minus the final training
loss (mean of the last 20 steps): a regulariser would shrink it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence

import numpy as np

from attnscale.experiments import (
  reporting,
  results_store,
  stats,
  sweep_results,
  sweeps,
  verdicts,
)
from attnscale.studies import registry

SHARED = "+shared_kv"
CONTROL = re.compile(r"\+kv_heads\d+")  # grouped-query: the parameter-matched control
ALIGNMENT = ("self_weight", "corr_qv", "corr_vv")
DIAGNOSTICS = ("entropy", "max_logit", "sink_rate")


def base_label(label: str) -> str:
  """The scaling a label compares against: 'cosine+shared_kv' -> 'cosine'."""
  return CONTROL.sub("", label.replace(SHARED, ""))


def num_params(workdir: str) -> int:
  """The parameters the run in `workdir` trains (from its config, no checkpoint)."""
  import jax
  from flax import nnx

  from attnscale.evaluation import eval_lib
  from attnscale.runtime import train_state

  config = eval_lib.load_config(workdir)
  model = nnx.eval_shape(lambda: train_state.init_model(config))
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


def _at_best(rows: Sequence[dict]) -> dict[str, dict]:
  """Per label: its best rate's summary plus the mean train/validation gap there."""
  best = sweep_results.best_per_scaling(rows)
  for label, b in best.items():
    runs = [r for r in rows if r["scaling"] == label and r["learning_rate"] == b["learning_rate"]
            and r["status"] == "done"]
    gaps = [r["best_val_loss"] - r["final_train_loss"] for r in runs]
    b["gap"] = float(np.mean(gaps)) if gaps else math.nan
    b["val"] = float(np.mean([r["best_val_loss"] for r in runs])) if runs else math.nan
    b["runs"] = runs
  return best


def _by_seed(best: dict, value=lambda r: r["final_train_loss"]) -> dict:
  """{seed: value(run)} (default: its final training loss) of the runs at a label's
  best rate (`_at_best`)."""
  return {r["seed"]: value(r) for r in best["runs"]}


def _val(r: dict) -> float:
  return r["best_val_loss"]


def _gap(r: dict) -> float:
  return r["best_val_loss"] - r["final_train_loss"]


def comparison_rows(rows: Sequence[dict], workdir: str) -> list[dict]:
  """One row per label, grouped by scaling (separate first): loss, difference from
  the same scaling's separate projections and whether it is within noise."""
  best = _at_best(rows)
  order = sorted(best, key=lambda label: (base_label(label), label != base_label(label),
                                          label))
  out = []
  for label in order:
    b, ref = best[label], best.get(base_label(label))
    # Paired where the two share seeds, Welch otherwise (stats.compare: b - ref).
    same = (stats.compare(_by_seed(ref), _by_seed(b)) if ref is not None and ref is not b
            else None)
    diff = b["final_train_loss"] - ref["final_train_loss"] if ref is not None else math.nan
    # Shared K/V against the parameter-matched control (grouped-query attention with
    # as many K/V parameters), where the sweep ran one for this scaling.
    control = next((best[c] for c in order if c.startswith(base_label(label) + "+kv_heads")),
                   None)
    matched = (stats.compare(_by_seed(control), _by_seed(b))
               if control is not None and label.endswith("+shared_kv") else None)
    out.append({
        "label": label, "params": num_params(os.path.join(workdir, b["runs"][0]["run"])),
        "best_lr": b["learning_rate"], "seeds": b["seeds"],
        "final_train_loss": b["final_train_loss"], "se": b["se"],
        "vs_separate": diff if ref is not b else 0.0,
        "interval": "" if same is None else same.format(verdict=False),
        "verdict": ("baseline" if ref is b else "-" if same is None or same.method == "none"
                    else same.verdict),
        "vs_control": "" if matched is None else matched.format(),
        "best_val_loss": b["val"], "val_minus_train": b["gap"],
        # The same comparison on the validation loss and on the gap (a regulariser
        # would shrink the gap), paired the same way.
        **{f"{name}_vs_separate": (stats.compare(_by_seed(ref, f), _by_seed(b, f)).format()
                                   if same is not None else "")
           for name, f in (("val", _val), ("gap", _gap))}})
  # Holm over the tied-or-matched variants' comparisons with their separate
  # projections (docs/guides/sweeps.md, verdicts that hold).
  family = verdicts.family({
      r["label"]: stats.compare(_by_seed(best[base_label(r["label"])]), _by_seed(best[r["label"]]))
      for r in out if r["interval"]})
  # Tie-robust: the verdict at every pairing of the two labels' tied rates (training loss).
  by_rate = {label: {lr: sweep_results.seed_losses(rows, label, lr)
                     for lr in {r["learning_rate"] for r in rows if r["scaling"] == label}}
             for label in best}
  for r in out:
    r["holm"] = family.get(r["label"]) or ("baseline" if r["verdict"] == "baseline" else "-")
    ref = base_label(r["label"])
    if r["interval"] and ref in best:
      ties = [stats.tie_set({lr: v for lr, v in by_rate[x].items() if v},
                            best[x]["learning_rate"]) for x in (ref, r["label"])]
      r["robust"] = verdicts.robust(by_rate[ref], by_rate[r["label"]], *ties) or "-"
    else:
      r["robust"] = "baseline" if r["verdict"] == "baseline" else "-"
  return out


def _with_weights(run: str, workdir: str, weights: str | None) -> str:
  """The directory of `run` that has its checkpoints: the sweep's own, else the one
  of that name in `weights` (sweep.py --retrain_best_to), else a one-line error."""
  for root in (workdir, weights):
    path = os.path.join(root, run) if root else None
    if path and os.path.isdir(os.path.join(path, "checkpoints")):
      return path
  raise SystemExit(f"shared_kv: the best run {run} has no weights in {workdir} (an archive?) "
                   f"nor in --weights ({weights}): train it again with sweep.py "
                   "--retrain_best_to=DIR and give --weights DIR")


def diagnostic_rows(rows: Sequence[dict], workdir: str, weights: str | None = None
                    ) -> list[dict]:
  """The seed-0 run at each label's best rate: attention diagnostics and value
  alignment on the first validation batch, means over layers and heads. Its weights
  are read from `workdir`, or from `weights` where `workdir` holds records only."""
  from attnscale import tasks
  from attnscale.evaluation import diagnostics, eval_lib

  out = []
  for run in sweep_results.best_runs(rows):
    path = _with_weights(run, workdir, weights)
    config = eval_lib.load_config(path)
    task = tasks.get_task(config)
    model, step, _ = eval_lib.restore(config, path)
    batch = next(iter(task.eval_batches()))
    stats = diagnostics.task_attention_stats(model, task, batch)
    aligned = diagnostics.task_value_alignment(model, task, batch)
    label = next(r["scaling"] for r in rows if r["run"] == run)
    row = {"label": label, "step": int(step)}
    row |= {k: float(np.mean([layer[k] for layer in stats])) for k in DIAGNOSTICS
            if k != "max_logit"}
    row["max_logit"] = float(max(layer["max_logit"] for layer in stats))
    row |= {k: float(np.mean([layer[k] for layer in aligned])) for k in ALIGNMENT}
    row["per_layer_corr_qv"] = " ".join(f"{layer['corr_qv']:.2f}" for layer in aligned)
    out.append(row)
  return sorted(out, key=lambda r: (base_label(r["label"]), r["label"]))


def plot(rows: Sequence[dict], diag: Sequence[dict]):
  """Left: final loss against learning rate, one line per label (the seed mean) and
  a dot per seed. Right: the value-alignment measures per label (seed 0)."""
  fig = reporting.new_figure(15, 4.8)
  ax_lr, ax_al = fig.subplots(1, 2)
  by_label: dict[str, dict[float, list[float]]] = {}
  for r in rows:
    if r["status"] in ("done", "diverged"):
      by_label.setdefault(r["scaling"], {}).setdefault(r["learning_rate"], []).append(
          r["final_train_loss"])
  for label, losses in sorted(by_label.items()):
    lrs = sorted(losses)
    style = reporting.style(sorted({base_label(x) for x in by_label}).index(base_label(label)))
    style["ls"] = "--" if SHARED in label else ":" if CONTROL.search(label) else "-"
    ax_lr.plot(lrs, [np.nanmean(losses[lr]) for lr in lrs], label=label, **style)
    # Every seed as a faint dot: the spread behind each mean.
    seeds = [(lr, v) for lr in lrs for v in losses[lr] if np.isfinite(v)]
    ax_lr.plot([lr for lr, _ in seeds], [v for _, v in seeds], ".", alpha=0.35,
               color=style.get("color"), ms=5)
  ax_lr.set_xscale("log", base=2)
  reporting.label_axes(ax_lr, xlabel="learning rate", ylabel="final training loss",
                       title="separate (solid), shared K/V (dashed), kv_heads=2 (dotted); "
                             "dots: seeds")
  ax_lr.legend(fontsize=7)
  x = np.arange(len(diag))
  for j, name in enumerate(ALIGNMENT):
    ax_al.bar(x + (j - 1) * 0.27, [d[name] for d in diag], 0.27, label=name)
  ax_al.set_xticks(x, [d["label"] for d in diag], rotation=35, ha="right", fontsize=7)
  ax_al.axhline(0, color="k", lw=0.8)
  reporting.label_axes(ax_al, xlabel="", ylabel="mean over layers and heads",
                       title="weight on self; corr(weight, cos(q, v)); corr(weight, cos(v_i, v_j))")
  ax_al.legend(fontsize=7)
  return fig


def run_cli(args) -> tuple[list[str], list[str]]:
  """`python -m attnscale.studies shared_kv --out DIR --workdirs SWEEP [CPU_SWEEP]`."""
  if not args.workdirs or len(args.workdirs) > 2:
    raise SystemExit("shared_kv: give --workdirs SWEEP_DIR [CPU_SWEEP_DIR] (the shared_kv "
                     "and shared_kv_cpu sweeps' workdirs)")
  workdir = args.workdirs[0]
  rows = [r for r in sweeps.collect(workdir) if r["status"] != "new"]
  table = comparison_rows(rows, workdir)
  # The diagnostics restore the best runs' weights, which an archive does not keep.
  diag = None if args.no_diagnostics else diagnostic_rows(rows, workdir, args.weights)
  notes = [f"{len(rows)} runs of the shared_kv sweep ({results_store.shown(workdir)}); final training loss = mean "
           "of the last 20 steps, mean ± s.e. over seeds at each label's best rate.",
           "vs_separate: minus the same scaling with separate projections; verdict: its "
           "95% t-interval (paired by seed where the two share seeds, else Welch; "
           "attnscale.experiments.stats.compare) lies above 0 (worse), below (better) or "
           "covers 0 (within noise); interval: that difference's 95% t-interval. "
           "+kv_heads2: separate K/V with grouped-query attention (2 key/value heads), the "
           "same parameter count as shared; vs_control: shared minus it, with its interval.",
           "val_minus_train: best validation loss minus final training loss (a regulariser "
           "would shrink it); val_vs_separate, gap_vs_separate: the comparison with separate "
           "projections on the best validation loss and on that gap; robust: the verdict "
           "at every pairing of the two labels' tied rates; holm: vs_separate's "
           "Holm-adjusted p over the labels, with the verdict where it survives "
           "(docs/guides/sweeps.md, verdicts that hold).",
           registry.code_note(rows, args, "shared_kv") + "; every run: runs.csv."]
  fmt = {"formats": {"best_lr": reporting.power_of_two, "params": "d", "seeds": "d"},
         "floats": ".4f"}
  paths = reporting.write_tables(table, args.out, "shared_kv",
                                 title="Shared keys and values against separate", notes=notes,
                                 **fmt)
  if diag is not None:
    paths += reporting.write_tables(
        diag, args.out, "shared_kv_diag",
        title="Attention diagnostics of the best runs (seed 0)",
        notes=["First validation batch; entropy and sink rate: means over layers and heads; "
               "max_logit: the largest; self_weight, corr_qv, corr_vv: "
               "attnscale.evaluation.diagnostics.value_alignment, means over layers and "
               "heads (per_layer_corr_qv: per layer)."], floats=".3f")
    paths.append(reporting.save_figure(plot(rows, diag), args.out, "shared_kv"))
  sweep_results.write_results(rows, os.path.join(args.out, "sweep"), title="shared_kv sweep")
  path = os.path.join(args.out, "runs.csv")
  sweep_results.write_runs_csv(rows, path)
  paths.append(path)
  if len(args.workdirs) == 2:
    cpu = [r for r in sweeps.collect(args.workdirs[1]) if r["status"] != "new"]
    paths += reporting.write_tables(
        comparison_rows(cpu, args.workdirs[1]), args.out, "shared_kv_cpu",
        title="Shared keys and values at the cpu preset (width 128, 1000 steps)",
        notes=[f"{len(cpu)} runs ({results_store.shown(args.workdirs[1])}), the preset's learning rate 2e-3 with "
               "cosine decay; mean ± s.e. over seeds."], **fmt)
  return paths, notes


def arguments(p) -> None:
  g = p.add_argument_group("shared_kv")
  g.add_argument("--weights", default=None,
                 help="shared_kv: where the seed-0 best runs' weights are when the sweep's "
                      "workdir is an archive of records (sweep.py --retrain_best_to=DIR)")
  g.add_argument("--no_diagnostics", action="store_true",
                 help="shared_kv: the tables from the runs' records alone, without the "
                      "diagnostics table and the figure (which need the best runs' weights)")


# Reads the shared_kv sweeps' layout: only when asked for.
STUDY = registry.Study(run_cli, in_all=False, needs_workdirs=True, arguments=arguments)
