"""What a run directory says about itself: done or not, its results row, its
records archived without weights, its evaluation.

A run directory is what `train.py --workdir` (or one run of a pack) writes:
config.json, metrics.jsonl, provenance.json, checkpoints/, and eval.json once
evaluated. A sweep asks `status` which points to (re)start, `archive` copies a
finished run's records (no weights: small enough to commit) so that a study can be
recomputed and a staged sweep resumed on another machine, and `read_run` turns a
run into one row of a results table. Nothing here imports JAX unless it must read
a checkpoint (`status(..., read_checkpoint=True)`) or evaluate (`evaluate_finished`).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
from collections.abc import Sequence

from attnscale.config import labels, migration
from attnscale.runtime import metric_keys as keys
from attnscale.runtime import metrics_writer


def checkpoint_steps(run_dir: str) -> list[int]:
  """The steps of the checkpoints on disk in `run_dir`, ascending ([] if none)."""
  path = os.path.join(run_dir, "checkpoints")
  return sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []


def status(run_dir: str, read_checkpoint: bool = True) -> str:
  """'done' (a checkpoint at num_train_steps), 'diverged', 'partial' (started) or 'new'.

  'diverged': the run stopped on a non-finite loss or gradient norm, which
  train.py and a pack write as the metrics' last row before stopping. It is an
  outcome, not an interruption: a rerun of the same code and seed diverges again,
  so a sweep neither reruns it nor counts it failed, and `archive` keeps it
  (delete its directory to retry it, after changing the code).

  A final checkpoint that cannot be read (a truncated file) is 'partial': it is
  read in full (`read_checkpoint`; False looks at the step numbers alone), so a
  sweep reruns the point, whose train.py sets the damaged checkpoint aside and
  redoes the steps from the newest one that reads. An archived run (`archive`:
  its records without weights, ARCHIVED naming its last step) is 'done' or
  'diverged' as it was.
  """
  config_path = os.path.join(run_dir, "config.json")
  if not os.path.exists(config_path):
    return "new"
  with open(config_path) as f:
    num_steps = json.load(f)["num_train_steps"]
  steps = checkpoint_steps(run_dir)
  if (not steps or steps[-1] < num_steps) and _stopped_non_finite(run_dir):
    return "diverged"
  if not steps and os.path.exists(os.path.join(run_dir, ARCHIVED)):
    with open(os.path.join(run_dir, ARCHIVED)) as f:
      return "done" if json.load(f).get("step") == num_steps else "partial"
  if not steps or steps[-1] < num_steps:
    return "partial"
  return "done" if not read_checkpoint or _reads(run_dir, steps[-1]) else "partial"


def _stopped_non_finite(run_dir: str) -> bool:
  """Whether the last training row of `run_dir`'s metrics has a non-finite loss or
  gradient norm (the row a run that diverged writes last)."""
  last = None
  for line in metrics_writer.read_lines(run_dir):
    if f'"{keys.LOSS}"' in line:
      last = line
  if last is None:
    return False
  row = json.loads(last)
  return not (math.isfinite(row[keys.LOSS]) and math.isfinite(row.get(keys.GRAD_NORM, 0.0)))


# The statuses that are final: trained to the end, or stopped on a NaN (a sweep
# does not rerun them, `archive` keeps them).
FINISHED = ("done", "diverged")
# A finished run's records, without its weights: what `archive` copies (metrics.jsonl
# gzipped: metrics_writer.ARCHIVED_METRICS_FILE).
ARCHIVED = "archived.json"
# scales.json: the precision study's scale analysis of the last checkpoint
# (attnscale/studies/precision.py `tracked`), which needs the weights to compute.
RECORDS = ("config.json", "metrics.jsonl", "provenance.json", "eval.json", "scales.json")


def archive(workdir: str, dest: str, names: Sequence[str] | None = None) -> list[str]:
  """Copies the records (RECORDS) of every finished run in `workdir` (or of those
  of `names` that finished) to `dest/<run>/`, with ARCHIVED ({"step": its last
  step}); returns the runs copied. A run that diverged is finished too: its
  divergence is a result (a study's "x"), and it stays 'diverged' in the archive.

  A results store as `dest` (docs/results/<study>/runs.parquet[/FOLDER]):
  `results_store.archive`, which stages the records here and adds them to it.

  What a sweep's results need, small enough to commit (tens of kB a run, no
  checkpoints): `collect` and the studies read an archived run as any other, and
  a sweep counts it done (`status`), so unpacking the store into a fresh workdir
  (`python -m attnscale.experiments.results_store unpack STORE WORKDIR`) resumes
  a staged sweep on another machine without rerunning what finished. eval.py
  needs the weights: evaluate first.
  """
  copied = []
  for name in sorted(os.listdir(workdir) if names is None else names):
    run_dir = os.path.join(workdir, name)
    state = status(run_dir, read_checkpoint=False) if os.path.isdir(run_dir) else "new"
    if state not in FINISHED:
      continue
    os.makedirs(os.path.join(dest, name), exist_ok=True)
    for record in RECORDS:
      if record == metrics_writer.METRICS_FILE:
        _archive_metrics(run_dir, os.path.join(dest, name))
      elif os.path.exists(os.path.join(run_dir, record)):
        shutil.copyfile(os.path.join(run_dir, record), os.path.join(dest, name, record))
    with open(os.path.join(run_dir, "config.json")) as f:
      step = json.load(f)["num_train_steps"]
    if state == "diverged":  # its last step is the bad one, in its metrics
      step = read_run(run_dir)["steps"]
    with open(os.path.join(dest, name, ARCHIVED), "w") as f:
      json.dump({"step": step, "status": state}, f)
    copied.append(name)
  return copied


def _archive_metrics(run_dir: str, dest_run: str) -> None:
  """`run_dir`'s metrics (plain or already gzipped) as dest_run/metrics.jsonl.gz,
  byte-for-byte the same for the same lines (no timestamp in the gzip header); a
  plain metrics.jsonl an older archive left there is replaced."""
  lines = metrics_writer.read_lines(run_dir)
  if not lines:
    return
  data = gzip.compress("".join(lines).encode(), mtime=0)
  path = os.path.join(dest_run, metrics_writer.ARCHIVED_METRICS_FILE)
  with open(path + ".tmp", "wb") as f:
    f.write(data)
  os.replace(path + ".tmp", path)
  plain = os.path.join(dest_run, metrics_writer.METRICS_FILE)
  if os.path.exists(plain) and os.path.realpath(plain) != os.path.realpath(
      os.path.join(run_dir, metrics_writer.METRICS_FILE)):
    os.remove(plain)


def evaluate_finished(workdir: str) -> list[str]:
  """Runs eval.py's evaluation (`eval_lib.evaluate_run`: the whole validation split,
  written to eval.json) on every finished run in `workdir` that has its weights
  and no eval.json from its last step; returns the runs evaluated.

  `archive` keeps no weights, so a run archived before it was evaluated can never
  be evaluated again: a study that later finds it at a best rate has one seed
  fewer (docs/experiments/bert.md). `sweep.py --evaluate` calls this before each
  archive.
  """
  from attnscale.evaluation import eval_lib  # JAX: only when evaluating

  done = []
  for name in sorted(os.listdir(workdir)):
    run_dir = os.path.join(workdir, name)
    checkpoints = os.path.join(run_dir, "checkpoints")
    if (not os.path.isdir(run_dir) or status(run_dir, read_checkpoint=False) != "done"
        or evaluated(run_dir) or not os.path.isdir(checkpoints)
        or not any(step.isdigit() for step in os.listdir(checkpoints))):
      continue
    eval_lib.evaluate_run(run_dir)
    done.append(name)
  return done


def _reads(run_dir: str, step: int) -> bool:
  """Whether checkpoint `step` of `run_dir` reads in full, onto one device here."""
  import jax  # here: reading the results needs no JAX

  from attnscale.evaluation import eval_lib
  from attnscale.runtime import checkpoints as ckpt
  from attnscale.runtime import train_state as ts

  config = eval_lib.load_config(run_dir)
  shapes = ts.state_shapes(config)
  shardings = ts.state_shardings(shapes, ts.make_mesh(None, jax.devices()[:1]))
  checkpoints = ckpt.Checkpoints(run_dir, config.keep_checkpoints)
  try:
    checkpoints.restore(shapes, shardings, step)
    return True
  except ckpt.DamagedCheckpointError:
    return False
  finally:
    checkpoints.close()



def evaluated(run_dir: str) -> bool:
  """eval.json exists and is from the run's last step."""
  path = os.path.join(run_dir, "eval.json")
  if not os.path.exists(path):
    return False
  with open(path) as f, open(os.path.join(run_dir, "config.json")) as g:
    return json.load(f).get("step") == json.load(g)["num_train_steps"]


def read_run(run_dir: str) -> dict | None:
  """One row of the results table from a run directory (None if never started).

  scaling is the run's label, what its studies group it by (`labels.of`: the one
  its sweep declared in config.label, else derived from the config);
  final_train_loss is the last logged `train/loss_last20` (Graphcore's metric:
  the mean training loss over the last 20 steps); wall_s sums every process's
  `elapsed_s` (a resumed run adds its segments). A run that stopped on a NaN
  (loss or gradient norm) has status 'diverged' and final_train_loss NaN.
  max_logit is the largest attention logit of the last log row that has one
  (max over layers of `train/attn/max_logit/layer_<i>`; NaN without attention
  metrics); commit is the code the run came from (`provenance.commit_of`:
  "unknown" without a provenance.json), host the machine it trained on
  (`provenance.host_of`: the CPU's model and vector width, or the chip).
  """
  from attnscale.runtime import provenance  # here: this function's only use
  config_path = os.path.join(run_dir, "config.json")
  if not os.path.exists(config_path):
    return None
  with open(config_path) as f:
    config = migration.migrate(json.load(f))
  records = metrics_writer.read_rows(run_dir)
  train = [r for r in records if keys.LOSS in r]
  val = [r[keys.VAL_LOSS] for r in records if keys.VAL_LOSS in r]
  wall, previous = 0.0, 0.0
  for r in train:
    elapsed = r.get(keys.ELAPSED_S, 0.0)
    if elapsed < previous:  # a new process (resume) started a new segment
      wall += previous
    previous = elapsed
  state = status(run_dir, read_checkpoint=False)  # the metrics are what a row reads
  last_step = train[-1]["step"] if train else 0
  logits = [[v for k, v in r.items() if k.startswith(keys.MAX_LOGIT)]
            for r in train]
  logits = [per_layer for per_layer in logits if per_layer]
  model = config["model"]
  return {
      "scaling": labels.of(config),
      "variant": model.get("variant", "standard"),
      "learning_rate": config["learning_rate"],
      "seed": config["seed"],
      "steps": last_step,
      "final_train_loss": train[-1].get(keys.LOSS_LAST20, math.nan) if state == "done"
                          else math.nan,
      "best_val_loss": min(val) if val else math.nan,
      "wall_s": wall + previous,
      "status": state,
      "run": os.path.basename(os.path.normpath(run_dir)),
      "curve": [(r["step"], r[keys.LOSS]) for r in train],
      "max_logit": float(max(logits[-1])) if logits else math.nan,
      "commit": provenance.commit_of(run_dir),
      "host": provenance.host_of(run_dir),
  }


