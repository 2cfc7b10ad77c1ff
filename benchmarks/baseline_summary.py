"""A public baseline's runs beside its published number: one row a run, then the mean.

    python benchmarks/baseline_summary.py --published 1.88 runs/nanogpt_cpu_s0 runs/nanogpt_cpu_s1 \
        runs/nanogpt_cpu_s2 --csv docs/results/nanogpt_cpu/summary.csv
    python benchmarks/baseline_summary.py --published 1.4697 runs/nanogpt   # gpu_session.sh

Each run directory needs train.py's metrics.jsonl and eval.py's eval.json. Per
run: the final validation estimate (the last `val/loss` row: nanoGPT's
estimate_loss, config.eval_batches random batches), the best one (nanoGPT
prints each and keeps the best checkpoint), the whole validation split
(eval.py), the sink rate (mean attention weight on the first key, averaged over
layers; per layer in eval.json) and, where eval.py gives it, the share of sink
heads (Gu et al.: first-key weight above 0.3), and the training wall time (train/elapsed_s at
the end: compilation, evaluations and checkpoints included). Then the mean of
each over the runs with its two-sided Student-t 95% interval
(attnscale/experiments/stats.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from attnscale.experiments import stats  # noqa: E402
from attnscale.runtime import metrics_writer  # noqa: E402

COLUMNS = ("run", "seed", "steps", "val_estimate_final", "val_estimate_best", "best_step",
           "val_whole_split", "sink_rate", "train_wall_s")


def summarise(workdir: str) -> dict:
  rows = metrics_writer.read_rows(workdir)
  vals = [(r["step"], r["val/loss"]) for r in rows if "val/loss" in r]
  best_step, best = min(vals, key=lambda sv: sv[1])
  elapsed = [r["train/elapsed_s"] for r in rows if "train/elapsed_s" in r]
  with open(os.path.join(workdir, "eval.json")) as f:
    ev = json.load(f)
  with open(os.path.join(workdir, "config.json")) as f:
    seed = json.load(f)["seed"]
  sinks = [layer["sink_rate"] for layer in ev.get("attention", []) if "sink_rate" in layer]
  # Gu et al.'s share of sink heads (first-key weight > 0.3), where eval.py gives it.
  heads = [layer["sink_heads"] for layer in ev.get("attention", []) if "sink_heads" in layer]
  return {"run": os.path.basename(os.path.normpath(workdir)), "seed": seed,
          "steps": vals[-1][0], "val_estimate_final": vals[-1][1], "val_estimate_best": best,
          "best_step": best_step, "val_whole_split": ev["val_loss"],
          "sink_rate": sum(sinks) / len(sinks) if sinks else math.nan,
          **({"sink_heads": sum(heads) / len(heads)} if heads else {}),
          "train_wall_s": elapsed[-1] if elapsed else math.nan}


def _fmt(value) -> str:
  return f"{value:.4f}" if isinstance(value, float) and abs(value) < 100 else (
      f"{value:.0f}" if isinstance(value, float) else str(value))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("workdirs", nargs="+")
  parser.add_argument("--published", type=float, help="the baseline's published loss")
  parser.add_argument("--csv", help="also write the rows (and the mean row) here")
  parser.add_argument("--curves", help="also write each run's validation estimates here "
                      "(run, step, val_loss)")
  args = parser.parse_args()
  runs = [summarise(w) for w in args.workdirs]
  columns = COLUMNS + (("sink_heads",) if all("sink_heads" in r for r in runs) else ())
  mean = {"run": "mean [95% t-interval]", "seed": "", "steps": "", "best_step": ""}
  for key in ("val_estimate_final", "val_estimate_best", "val_whole_split", "sink_rate",
              "train_wall_s", *columns[len(COLUMNS):]):
    iv = stats.mean_interval([r[key] for r in runs])
    mean[key] = (f"{_fmt(iv.mean)} [{_fmt(iv.lo)}, {_fmt(iv.hi)}]" if iv.n > 1
                 else _fmt(iv.mean))
  print("| " + " | ".join(columns) + " |")
  print("|" + "---|" * len(columns))
  for row in [*runs, mean]:
    print("| " + " | ".join(_fmt(row[c]) for c in columns) + " |")
  if args.published is not None:
    print(f"| published | | | {args.published} |" + " |" * (len(columns) - 4))
  if args.csv:
    os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
    with open(args.csv, "w", newline="") as f:
      writer = csv.DictWriter(f, columns)
      writer.writeheader()
      for row in [*runs, mean]:
        writer.writerow({c: _fmt(row[c]) for c in columns})
  if args.curves:
    with open(args.curves, "w", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(("run", "step", "val_loss"))
      for workdir in args.workdirs:
        name = os.path.basename(os.path.normpath(workdir))
        writer.writerows((name, r["step"], f"{r['val/loss']:.4f}")
                         for r in metrics_writer.read_rows(workdir) if "val/loss" in r)


if __name__ == "__main__":
  main()
