"""A run's directory: its lock, its config.json, resuming from its checkpoints.

    with workdir_lock(workdir, force) as lock: save_config(config, workdir); ...
    state = resume(checkpoints, state, shardings, workdir)

What `train_lib` (one run) and `packed` (R runs, each in its own directory) do to
a run directory before the loop (`attnscale.runtime.loop`) trains in it.
"""

from __future__ import annotations

import contextlib
import json
import os

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from attnscale.config import imports as config_imports
from attnscale.config import migration
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import configlib, run_lock


def log(msg: str) -> None:
  """Prints `msg` from process 0 only (the values it reports are global)."""
  if jax.process_index() == 0:
    print(msg, flush=True)


def save_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes WORKDIR/config.json; refuses to resume a run with another experiment.

  Raises:
    ValueError: the workdir holds a run whose config differs in a field that is
      not bookkeeping (the message lists them). Nothing in WORKDIR is touched.
  """
  path = os.path.join(workdir, "config.json")
  new = json.loads(config.to_json())
  if os.path.exists(path):
    with open(path) as f:
      old = migration.migrate(json.load(f))  # a run saved before a rename or a new field
    resumable = configlib.RESUMABLE_CHANGES + (
        ("num_train_steps",) if config.lr_schedule == "constant" else ())
    changed = [(k, old_v, new_v) for k, old_v, new_v in migration.flat_diff(old, new)
               if k.split(".")[0] not in resumable]
    diffs = [f"{k}: {old_v!r} -> {new_v!r}" for k, old_v, new_v in changed]
    if [k for k, _, _ in changed] == ["num_train_steps"]:  # continuing a run: why not this one
      _, steps_before, steps_now = changed[0]
      raise ValueError(
          f"--workdir {workdir}: num_train_steps {steps_before} -> {steps_now} cannot continue a "
          f"run under lr_schedule={config.lr_schedule!r}, whose decay lasts num_train_steps "
          "(the steps done would not be this run's): a run under "
          "--config.lr_schedule=constant continues, or start a new --workdir from this one's "
          f"parameters with --config.init_from={workdir}")
    if diffs:
      raise ValueError(f"--workdir {workdir} holds a run with a different config "
                       f"({'; '.join(diffs)}): use a new --workdir to start another run")
  if jax.process_index() == 0:
    with open(path + ".tmp", "w") as f:
      json.dump(new, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)


@contextlib.contextmanager
def workdir_lock(workdir: str, force: bool):
  """Holds WORKDIR/LOCK for the run (`attnscale.runtime.run_lock`); yields the lock.

  Process 0 takes it for all; if it cannot, every process stops (the others
  with a line pointing to process 0's error).

  Raises:
    run_lock.LockedError: another run holds the lock (one line, naming it).
  """
  lock, error = run_lock.RunLock(workdir, force=force, note=log), None
  if jax.process_index() == 0:
    try:
      lock.acquire()
    except run_lock.LockedError as e:
      error = e
  if jax.process_count() > 1:
    taken = multihost_utils.broadcast_one_to_all(np.int32(error is None))
    if not taken and error is None:
      error = run_lock.LockedError(f"process 0 could not lock --workdir {workdir} "
                                   "(its error says why)")
  if error is not None:
    raise error
  try:
    yield lock
  finally:
    lock.release()


def provenance_imports(config) -> dict:
  """The "imports" field of a run's provenance record ({} without config.imports)."""
  files = config_imports.import_files(config)
  return {"imports": files} if files else {}


def resume(checkpoints: ckpt.Checkpoints, state: ckpt.State, shardings, workdir: str):
  """`state` from the newest checkpoint that can be read (unchanged if none).

  Newer ones that cannot be read are set aside (`Checkpoints.set_aside`: moved
  to WORKDIR/damaged_checkpoints, not deleted), with one warning line.
  """
  if checkpoints.latest_step() is None:
    return state
  state, step, damaged = checkpoints.restore_newest_intact(state, shardings)
  for error in damaged:
    checkpoints.set_aside(error.step)
  if damaged:
    log(f"warning: {ckpt.describe_damaged(damaged)}; resuming from step {step}; the "
        f"damaged files are kept in {os.path.join(workdir, ckpt.DAMAGED_DIR)}")
  log(f"resumed from {workdir} at step {step}")
  if int(state["last_losses"]["count"]) == 0:
    log("  (the checkpoint predates the saved loss window: loss_last20 averages "
        "only the steps from here on)")
  return state


def has_checkpoint(workdir: str) -> bool:
  """Whether `workdir` holds a checkpoint (then a start resumes it; orbax's step
  folders are named by their step), read without creating anything."""
  folder = os.path.join(workdir, "checkpoints")
  return os.path.isdir(folder) and any(name.isdigit() for name in os.listdir(folder))


def start_from(source: str, config: ml_collections.ConfigDict, state: ckpt.State, shardings,
               workdir: str) -> tuple[ckpt.State, dict]:
  """`state` with the parameters of the run in `source` (config.init_from) at its
  newest checkpoint; the optimizer state, step and loss window stay fresh (a new
  run: its own schedule from step 0). Returns (state, the provenance record of the
  source: {"workdir", "step", "differs"}), and logs one line saying what differs
  between the two configs (model fields and seq_len: a longer context, other
  positions or another scaling).

  Raises:
    ValueError: (one line) `source` is not a run directory with a checkpoint, is
      `workdir` itself, or its parameters differ in shape or in name from this
      config's (naming them).
  """
  where = f"config.init_from={source}"
  if os.path.abspath(source) == os.path.abspath(workdir):
    raise ValueError(f"{where} is the run's own --workdir: rerunning a run resumes it; "
                     "init_from starts a new --workdir from another run's parameters")
  if not os.path.isfile(os.path.join(source, "config.json")):
    what = "does not exist" if not os.path.exists(source) else "has no config.json"
    raise ValueError(f"{where}: {source} {what} (from {os.getcwd()}): give a run directory")
  if not has_checkpoint(source):
    raise ValueError(f"{where}: {source} has no checkpoint to start from")
  with open(os.path.join(source, "config.json")) as f:
    old = migration.migrate(json.load(f))
  new = json.loads(config.to_json())
  differs = [f"{k} {a!r} -> {b!r}" for k, a, b in migration.flat_diff(old, new)
             if k.startswith("model.") or k == "seq_len"]
  checkpoints = ckpt.Checkpoints(source, keep=old.get("keep_checkpoints", 3))
  try:
    step = checkpoints.latest_step()
    saved, wanted = checkpoints.param_shapes(step), ckpt.param_shapes(state["params"])
    mismatched = [f"{p} {saved[p]} -> {wanted[p]}" for p in wanted
                  if p in saved and saved[p] != wanted[p]]
    mismatched += [f"{p} (not in {source})" for p in wanted if p not in saved]
    mismatched += [f"{p} (only in {source})" for p in saved if p not in wanted]
    if mismatched:
      because = f" (the configs differ in {', '.join(differs)})" if differs else ""
      raise ValueError(f"{where}: the parameters differ in shape: {'; '.join(mismatched)}"
                       f"{because}; a run starts only from one whose parameters match")
    params = checkpoints.restore_params(state["params"], shardings["params"], step)
  finally:
    checkpoints.close()
  log(f"started from the parameters of {source} at step {step} (optimizer state fresh); "
      + (f"differs in {', '.join(differs)}" if differs else "the same model and seq_len"))
  return {**state, "params": params}, {"workdir": os.path.abspath(source), "step": step,
                                       "differs": differs}
