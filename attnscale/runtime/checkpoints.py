"""Orbax checkpoints of the train state: save, restore (into any mesh's shardings),
and what to do with a checkpoint that cannot be read.

A run's checkpoints live in WORKDIR/checkpoints, one orbax step folder each. A
damaged one (a truncated or missing file) is never deleted: `Checkpoints.set_aside`
moves it to WORKDIR/damaged_checkpoints and the run resumes from the newest intact
step (`restore_newest_intact`), agreed between all processes of a multi-host run.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

State = dict[str, Any]

# State entries a checkpoint may lack because it predates them: restoring one
# keeps their initial value (see `Checkpoints.restore`).
ADDED_STATE_ENTRIES = ("last_losses",)


def abstract_state(state, shardings):
  """`state`'s leaves as jax.ShapeDtypeStructs carrying `shardings` (restore targets)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      state, shardings)


# Where `Checkpoints.set_aside` keeps the checkpoints that cannot be read.
DAMAGED_DIR = "damaged_checkpoints"


class DamagedCheckpointError(ValueError):
  """A checkpoint on disk that cannot be read: a file of it truncated, missing or
  garbled (a full disk, a failing volume, a copy cut short). `directory` (the
  run's checkpoints/), `step`, `why` (the first line of the reader's error)."""

  def __init__(self, directory: str, step: int, why: str):
    super().__init__(f"checkpoint {step} in {directory} cannot be read ({why})")
    self.directory, self.step, self.why = directory, step, why


def describe_damaged(damaged: list[DamagedCheckpointError]) -> str:
  """One clause for a run's unreadable steps (newest first): the newest one's error."""
  if len(damaged) == 1:
    return str(damaged[0])
  newest = damaged[0]
  return (f"checkpoints {', '.join(str(e.step) for e in damaged)} in {newest.directory} "
          f"cannot be read (step {newest.step}: {newest.why})")


class Checkpoints:
  """Orbax checkpoints of the train state in WORKDIR/checkpoints.

  Saves are asynchronous; `close` waits for the last one. A step that is already
  on disk is never overwritten.

  Damage: a checkpoint "cannot be read" when orbax fails to read its metadata or
  arrays (any error: tensorstore reports a truncated file as ValueError, a lost
  chunk as a bare Exception, a torn _METADATA as a JSON error). Every damage we
  tried (truncating or deleting each file of a step in turn) either fails so or
  restores the same arrays (files orbax no longer reads). A layout this code
  does not know is its own ValueError, never "damaged"; and since every
  checkpoint of a run has one layout, an error that is not damage fails every
  step alike, which `restore_newest_intact` reports without touching anything.
  """

  def __init__(self, workdir: str, keep: int):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        # Named, so that `item_metadata` can read a checkpoint this manager did not write.
        item_handlers=ocp.StandardCheckpointHandler())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: State) -> None:
    if step in self.manager.all_steps():
      return
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore(self, state: State, shardings, step: int | None = None, *,
              alone: bool = False, only: tuple[str, ...] | None = None) -> State:
    """Restores `step` (default: latest) into the layout of `state`.

    `alone`: read without orbax's barrier of every process after the read, for a
    caller that agrees with the others itself (`restore_newest_intact`).
    `only`: these entries alone (orbax's partial restore: the others, the optimizer
    state for one, are not read, so a checkpoint whose optimizer state is damaged
    still evaluates); the result holds just them.

    An entry of `ADDED_STATE_ENTRIES` that the checkpoint lacks (it was written
    before the entry existed) keeps its value in `state`, the initial one.

    Raises:
      DamagedCheckpointError: the checkpoint cannot be read (one line, naming
        the step and the first line of orbax's error).
      ValueError: there is no checkpoint `step`, or it holds entries this code
        does not know, or lacks one it cannot do without (one line, naming them).
    """
    step = self.latest_step() if step is None else step
    if step not in self.manager.all_steps():
      raise ValueError(f"no checkpoint of step {step} in {self.manager.directory} "
                       f"(it has steps {sorted(self.manager.all_steps())})")
    if only is not None:
      return self._restore_entries({k: state[k] for k in only},
                                   {k: shardings[k] for k in only}, step)
    with self._reading(step):
      saved = set(self.manager.item_metadata(step).keys())  # None.keys(): no _METADATA
    lacking = [k for k in state if k not in saved]
    unknown = sorted(saved - set(state))
    if unknown or set(lacking) - set(ADDED_STATE_ENTRIES):
      raise ValueError(
          f"checkpoint {step} in {self.manager.directory} has the state entries "
          f"{sorted(saved)}, this code expects {sorted(state)}: was it written by "
          "another version of attnscale?")
    kept = [k for k in state if k in saved]
    args = ocp.args.StandardRestore(
        abstract_state({k: state[k] for k in kept}, {k: shardings[k] for k in kept}))
    with self._reading(step):
      if alone:  # the manager's own item handler and folder, without its barrier
        handler = ocp.StandardCheckpointHandler()
        try:
          restored = handler.restore(
              epath.Path(self.directory) / str(step) / "default", args=args)
        finally:
          handler.close()
      else:
        restored = self.manager.restore(step, args=args)
    return {k: restored[k] if k in saved else state[k] for k in state}

  @contextlib.contextmanager
  def _reading(self, step: int):
    """Turns any error of orbax reading checkpoint `step` into DamagedCheckpointError."""
    try:
      yield
    except Exception as e:  # noqa: BLE001 (see the class docstring)
      lines = str(e).strip().splitlines() or [type(e).__name__]
      # tensorstore appends its whole spec to a chunk's error; the first clause says it.
      why = lines[0].split(" See full TensorStore details")[0]
      raise DamagedCheckpointError(self.directory, step,
                                   why if len(why) <= 300 else why[:297] + "...") from e

  def restore_newest_intact(self, state: State, shardings, *,
                            only: tuple[str, ...] | None = None) -> tuple[State, int, list]:
    """The newest checkpoint that can be read, restored; steps newest first
    (`only`: of these entries, as `restore` reads them).

    Returns:
      (state, its step, the DamagedCheckpointErrors of the newer steps).

    Several processes read each step without orbax's barrier after the read
    (which a process whose read failed would never reach: the others would wait
    there for orbax's 300 s) and then agree (an all-gather): a step that none
    can read is damaged and all go on to the previous one; one that only some
    can read stops every process, since the files differ between the processes
    (a --workdir that is not shared, a copy in progress) and setting the step
    aside would be wrong for those that read it.

    Raises:
      ValueError: there is no checkpoint, or none can be read (one line, naming
        the steps and the newest one's error), or some processes can read a step
        and others cannot (one line, in every process). Nothing on disk is changed.
    """
    damaged = []
    several = jax.process_count() > 1
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored, error = self.restore(state, shardings, step, alone=several, only=only), None
      except DamagedCheckpointError as e:
        restored, error = None, e
      read = _each_process(error is None)
      if all(read):
        return restored, step, damaged
      if any(read):
        cannot = [i for i, ok in enumerate(read) if not ok]
        why = f" ({error.why})" if error else ""
        raise ValueError(
            f"checkpoint {step} in {self.directory} cannot be read by process"
            f"{'es' if len(cannot) > 1 else ''} {', '.join(map(str, cannot))} of "
            f"{len(read)}{why} but can by the others: do all processes see the same "
            "--workdir? Nothing was changed")
      damaged.append(error)
    if not damaged:
      raise ValueError(f"no checkpoint in {self.directory}")
    raise ValueError(f"no checkpoint can be read: {describe_damaged(damaged)}; the run "
                     "directory is left as it is (to start afresh, move checkpoints/ away)")

  def param_shapes(self, step: int) -> dict[str, tuple[int, ...]]:
    """{"/"-joined path: shape} of the parameters saved at `step`, from its metadata
    (no array is read)."""
    with self._reading(step):
      params = self.manager.item_metadata(step)["params"]
    return {_path(p): tuple(m.shape) for p, m in jax.tree_util.tree_flatten_with_path(params)[0]}

  def restore_params(self, params, shardings, step: int):
    """The parameters saved at `step` alone (`restore(..., only=("params",))`), into
    the layout of `params` with `shardings`.

    Raises:
      DamagedCheckpointError: the checkpoint cannot be read.
    """
    return self._restore_entries({"params": params}, {"params": shardings}, step)["params"]

  def _restore_entries(self, state: State, shardings, step: int) -> State:
    target = abstract_state(state, shardings)
    handler = ocp.PyTreeCheckpointHandler()
    try:
      with self._reading(step):
        return handler.restore(
            epath.Path(self.directory) / str(step) / "default",
            args=ocp.args.PyTreeRestore(
                item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                partial_restore=True))
    finally:
      handler.close()

  def intact_steps(self, state: State, shardings, *,
                   only: tuple[str, ...] | None = None) -> list[int]:
    """The steps that restore (each read in full, or its `only` entries, into the
    layout of `state`)."""
    intact = []
    for step in sorted(self.manager.all_steps()):
      with contextlib.suppress(DamagedCheckpointError):
        self.restore(state, shardings, step, only=only)
        intact.append(step)
    return intact

  def set_aside(self, step: int) -> str:
    """Moves checkpoint `step` to WORKDIR/damaged_checkpoints/STEP (STEP.1, ... if
    that is taken) and forgets it; returns where it went.

    Nothing is deleted: the damaged files stay for inspection, out of orbax's
    sight. Left where it was, it would count as the latest step, a rerun's save of
    the same step would be refused as existing, and `keep` would collect an
    intact older step in its place. Process 0 moves it; every process calls this.
    """
    target = os.path.join(os.path.dirname(self.directory), DAMAGED_DIR, str(step))
    path, n = target, 0
    while os.path.exists(path):
      n += 1
      path = f"{target}.{n}"
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.rename(os.path.join(self.directory, str(step)), path)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"attnscale set_aside {step}")
    self.manager.reload()
    return path

  def wait(self) -> None:
    """Blocks until the saves in flight (orbax saves in a background thread) are on
    disk. The training loops call it while their Ctrl-C handler is still installed:
    a Ctrl-C then (a sweep's time limit, just as a run ends) would otherwise stop
    the process mid-commit and lose the finished run's last checkpoint."""
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def param_shapes(params) -> dict[str, tuple[int, ...]]:
  """{"/"-joined path: shape} of a parameter tree (`Checkpoints.param_shapes`' form)."""
  return {_path(p): tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def _path(path) -> str:
  """"blocks/0/attn/q_proj/kernel" for a tree path (nnx's trailing "value" dropped)."""
  keys = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
  return "/".join(keys[:-1] if keys and keys[-1] == "value" else keys)


def _each_process(ok: bool) -> list[bool]:
  """`ok` of every process, by process index (an all-gather; [ok] in one)."""
  if jax.process_count() == 1:
    return [ok]
  from jax.experimental import multihost_utils
  return [bool(x) for x in np.asarray(multihost_utils.process_allgather(np.int32(ok)))]
