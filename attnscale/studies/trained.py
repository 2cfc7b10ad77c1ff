"""Trained-model diagnostics: per-layer attention statistics of train.py runs.

For each layer of a trained model, on the first validation batch: the std of
the attention output (what fully scaled attention sets to about 1 at init), the
mean entropy of the attention weights in nats (0 = one key, log n = uniform)
and the largest logit (how far from temperature 1 the scaling sits). These are
`eval.py`'s diagnostics: read from WORKDIR/eval.json when it exists, else
computed from the latest checkpoint by the same function eval.py uses
(`attnscale.evaluation.diagnostics.task_attention_stats`: the task's first evaluation batch
with the task's attention masks, e.g. the masked LM's padding), which needs the
run's data set, as eval.py does.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

import numpy as np

from attnscale.experiments import reporting
from attnscale.studies import registry

STATS = (("output_std", "attention output std"), ("entropy", "attention entropy (nats)"),
         ("max_logit", "max logit"), ("sink_rate", "weight on the first key"))
HEAD_STATS = ("entropy", "max_logit", "sink_rate")


@dataclasses.dataclass(frozen=True)
class RunDiagnostics:
  """One run's per-layer statistics.

  Attributes:
    workdir: the run directory.
    scaling: the run's label (`attnscale.config.labels.of`: its sweep's, else its
      attention setup's, eval.json's "scaling").
    step: the checkpoint step the statistics come from.
    layers: per layer, {"output_std", "entropy", "max_logit", "sink_rate", "heads"}
      (eval.json's; runs evaluated before sink_rate and heads existed lack them).
    source: "eval.json" or "checkpoint".
  """

  workdir: str
  scaling: str
  step: int
  layers: list[dict[str, float]]
  source: str

  @property
  def label(self) -> str:
    """The scaling, and the run directory's name when it says something else."""
    name = os.path.basename(os.path.normpath(self.workdir))
    return self.scaling if name == self.scaling else f"{self.scaling} ({name})"


def run_diagnostics(workdir: str, *, recompute: bool = False) -> RunDiagnostics:
  """The per-layer attention statistics of the run in `workdir`.

  Args:
    workdir: a train.py run directory.
    recompute: ignore eval.json (it may be from an older checkpoint) and compute
      the statistics from the latest checkpoint.
  """
  path = os.path.join(workdir, "eval.json")
  if not recompute and os.path.exists(path):
    with open(path) as f:
      result = json.load(f)
    return RunDiagnostics(workdir, _label(workdir, result["scaling"]), int(result["step"]),
                          result["attention"], "eval.json")
  # Imported here: the synthetic studies need neither orbax nor the data sets.
  from attnscale import tasks
  from attnscale.config import labels
  from attnscale.evaluation import diagnostics, eval_lib

  config = eval_lib.load_config(workdir)
  task = tasks.get_task(config)
  model, step, _ = eval_lib.restore(config, workdir)
  layers = diagnostics.task_attention_stats(model, task)  # exactly eval.py's
  return RunDiagnostics(workdir, labels.of(config), int(step), layers, "checkpoint")


def _label(workdir: str, derived: str) -> str:
  """The run's declared label (config.label) where its sweep gave one, else `derived`
  (eval.json's, the run's attention setup)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):  # a hand-written eval.json
    return derived
  with open(path) as f:
    return json.load(f).get("label") or derived


@dataclasses.dataclass(frozen=True)
class TrainedResult:
  runs: list[RunDiagnostics]

  def rows(self) -> list[dict]:
    return [{"run": run.label, "scaling": run.scaling, "step": run.step, "layer": i,
             **{name: float(layer.get(name, np.nan)) for name, _ in STATS},
             "source": run.source}
            for run in self.runs for i, layer in enumerate(run.layers)]

  def head_rows(self) -> list[dict]:
    """One row per run, layer and head: entropy, max logit, sink rate."""
    return [{"run": run.label, "layer": i, "head": h,
             **{name: float(layer["heads"][name][h]) for name in HEAD_STATS}}
            for run in self.runs for i, layer in enumerate(run.layers) if "heads" in layer
            for h in range(len(layer["heads"]["entropy"]))]


  def summary_rows(self) -> list[dict]:
    """One row per run over all its layers and heads: mean and lowest head
    entropy, the largest logit, and the mean and largest head sink rate (the
    weight on the first key; causal attention with uniform weights over 64
    positions gives H_64 / 64 = 0.074)."""
    rows = []
    for run in self.runs:
      heads = [layer["heads"] for layer in run.layers if "heads" in layer]
      if not heads:
        continue
      per = {name: np.concatenate([np.asarray(h[name], float) for h in heads])
             for name in HEAD_STATS}
      rows.append({"run": run.label, "entropy_mean": float(per["entropy"].mean()),
                   "entropy_min": float(per["entropy"].min()),
                   "max_logit": float(per["max_logit"].max()),
                   "sink_rate_mean": float(per["sink_rate"].mean()),
                   "sink_rate_max": float(per["sink_rate"].max())})
    return rows


def trained_diagnostics(workdirs: Sequence[str], *, recompute: bool = False) -> TrainedResult:
  """`run_diagnostics` for each workdir, in order."""
  if not workdirs:
    raise ValueError("trained_diagnostics needs at least one workdir")
  return TrainedResult([run_diagnostics(w, recompute=recompute) for w in workdirs])


def plot_trained(result: TrainedResult):
  """Output std, entropy and max logit against layer, one line per run."""
  fig = reporting.new_figure(19, 4.6)
  axes = fig.subplots(1, len(STATS))
  for i, run in enumerate(result.runs):
    layers = np.arange(len(run.layers))
    for ax, (name, _) in zip(axes, STATS):
      ax.plot(layers, [layer.get(name, np.nan) for layer in run.layers], lw=1.5, ms=6,
              label=f"{run.label}, step {run.step}", **reporting.style(i))
  num_layers = max(len(run.layers) for run in result.runs)
  for ax, (_, title) in zip(axes, STATS):
    ax.set_xlabel("layer")
    ax.set_xticks(range(num_layers))
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
  axes[0].set_yscale("log")
  axes[0].axhline(1.0, color="k", ls=":", lw=1.0)
  fig.legend(handles=axes[0].get_lines()[:len(result.runs)], loc="outside lower center",
             ncol=min(len(result.runs), 4), fontsize=8)
  fig.suptitle("Attention diagnostics of trained runs (first validation batch)")
  return fig


# ---------------------------------------------------------------------------
# The command line: python -m attnscale.studies trained --workdirs RUN ...

def add_arguments(p) -> None:
  p.add_argument_group("trained").add_argument(
      "--recompute", action="store_true",
      help="ignore eval.json and compute from the latest checkpoint")


def run_trained(a):
  if not a.workdirs:
    raise SystemExit("trained: give one or more --workdirs (train.py run directories)")
  r = trained_diagnostics(a.workdirs, recompute=a.recompute)
  notes = ["Per-layer attention statistics on the first validation batch "
           "(eval.py's diagnostics); per head in trained_heads.csv / .md, per run "
           "over layers and heads in trained_summary.csv / .md."]
  heads = reporting.write_tables(r.head_rows(), a.out, "trained_heads",
                                 title="Attention diagnostics per head")
  heads += reporting.write_tables(r.summary_rows(), a.out, "trained_summary",
                                  title="Attention diagnostics per run, over layers and heads")
  paths, notes = reporting.write_study(plot_trained(r), r.rows(), a.out, "trained",
                        "Attention diagnostics of trained runs", notes)
  return paths + heads, notes


STUDY = registry.Study(run_trained, needs_workdirs=True, arguments=add_arguments)
