"""The last lines a run prints: what it reached, for a person, read from its own record.

    done: 1000 steps, 3 min 16 s (this start), 3 min 16 s of training in all
      final training loss 1.6240 (mean of the last 20 steps, step 1000)
      last validation loss 1.7667 (step 1000, 20 batches of the validation split)
      run files: runs/char_cpu (metrics.jsonl, TensorBoard events, checkpoints/, config.json)
      evaluate the whole split: python eval.py --workdir=runs/char_cpu

The evaluation is named as the training was started (`eval_command`): `python
eval.py` after `python train.py`, `attnscale-eval` after `attnscale-train`.

Read from WORKDIR/metrics.jsonl rather than from the loop's variables, so a run
that resumes at its last step (nothing to train) or after a kill says the same as
the start that finished it: the record is the run.
"""

from __future__ import annotations

import os
import sys

from attnscale.runtime import metric_keys, metrics_writer


def _last(rows: list[dict], key: str) -> tuple[int, float] | None:
  for row in reversed(rows):
    if key in row:
      return row["step"], row[key]
  return None


def duration(seconds: float) -> str:
  """'48 s', '3 min 16 s', '2 h 05 min'."""
  seconds = round(seconds)
  if seconds < 60:
    return f"{seconds} s"
  if seconds < 3600:
    return f"{seconds // 60} min {seconds % 60} s"
  return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def reached(workdir: str) -> dict:
  """What the run in `workdir` reached, from its metrics.jsonl: {"step": the last
  step logged, "train": (step, loss_last20) or None, "val": (step, val/loss) or None,
  "elapsed_s" and "steps_per_s": the last row's (step, value) or None}."""
  rows = metrics_writer.read_rows(workdir)
  return {"step": max((row["step"] for row in rows), default=0),
          "train": _last(rows, metric_keys.LOSS_LAST20),
          "val": _last(rows, metric_keys.VAL_LOSS),
          "elapsed_s": _last(rows, metric_keys.ELAPSED_S),
          "steps_per_s": _last(rows, metric_keys.STEPS_PER_S)}


def lines(workdir: str, *, wall_s: float, eval_batches: int | None = None,
          num_train_steps: int | None = None, argv0: str | None = None) -> list[str]:
  """The summary of the run in `workdir`, `wall_s` the seconds this start took; a run
  stopped before `num_train_steps` (SIGTERM) says so, the time left at its last
  measured rate, and how to go on. `argv0`: the training command (`eval_command`)."""
  end = reached(workdir)
  elapsed = end["elapsed_s"]
  if num_train_steps is not None and end["step"] < num_train_steps:
    rate = end["steps_per_s"]
    left = (f", about {duration((num_train_steps - end['step']) / rate[1])} left at "
            f"{rate[1]:.2f} steps/s" if rate else "")
    out = [f"stopped at step {end['step']} of {num_train_steps}, {duration(wall_s)} (this "
           f"start){left}: the same command resumes it"]
  else:
    total = f", {duration(elapsed[1])} of training in all" if elapsed else ""
    out = [f"done: {end['step']} steps, {duration(wall_s)} (this start){total}"]
  train, val = end["train"], end["val"]
  if train is not None:
    out.append(f"  final training loss {train[1]:.4f} (mean of the last 20 steps, "
               f"step {train[0]})")
  if val is not None:
    batches = f", {eval_batches} batches of the validation split" if eval_batches else ""
    out.append(f"  last validation loss {val[1]:.4f} (step {val[0]}{batches})")
  out.append(f"  run files: {workdir} (metrics.jsonl, TensorBoard events, checkpoints/, "
             "config.json)")
  out.append(f"  evaluate the whole split: {eval_command(argv0)} "
             f"--workdir={_shell_path(workdir)}")
  return out


def eval_command(argv0: str | None = None) -> str:
  """The evaluation command beside the training command `argv0` (default
  `sys.argv[0]`): `python eval.py` (with train.py's folder as it was typed) after a
  repository's train.py, `attnscale-eval` after `attnscale-train` or anything else
  (the console commands run from any folder)."""
  argv0 = sys.argv[0] if argv0 is None else argv0
  folder, name = os.path.split(argv0)
  eval_py = os.path.join(folder, "eval.py")
  if name == "train.py" and os.path.exists(eval_py) and os.path.basename(folder) != "commands":
    return f"python {_shell_path(eval_py)}"
  return "attnscale-eval"


def _shell_path(path: str) -> str:
  return path if " " not in path else f"'{path}'"
