"""How a training run stops on a signal: SIGTERM (preemption) and Ctrl-C (SIGINT).

Both finish the current step, save a checkpoint and stop; the same command then
resumes from it. They differ only in how the process ends: after a SIGTERM
train.py exits 0 (a preempted job did nothing wrong); after a Ctrl-C
`train_lib.train_and_evaluate` raises `Interrupted`, a KeyboardInterrupt, so
train.py exits 130 (128 + SIGINT, the shell's status for an interrupted command)
and a notebook cell shows as interrupted. A second Ctrl-C exits at once with 130,
without saving or waiting for a save in flight, as a hard kill would: the rerun
resumes from the last checkpoint on disk (orbax writes a step to a temporary
directory and renames it when complete, so a cut-off save is not taken for one).

Several processes: a save is collective, so all must stop at one step (see
`Preemption`); a Ctrl-C joins that protocol by turning into a SIGTERM.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import jax
from jax.experimental import multihost_utils

# What a second Ctrl-C prints (to stderr, by each process that gets it).
SECOND_CTRL_C = ("second Ctrl-C: stopped at once, without saving; rerunning the same command "
                 "resumes from the last checkpoint on disk\n")


class Interrupted(KeyboardInterrupt):
  """Ctrl-C stopped the run after saving a checkpoint; the message says at which step."""


class Preemption:
  """SIGTERM or Ctrl-C: save a checkpoint at a step boundary, then stop.

  One process: handlers set a flag the loop reads at each step boundary
  (`reached`). Several processes: each process would see its signal at a
  different step (or only one gets it), so the step is agreed by JAX's
  preemption sync manager, which `jax.distributed.initialize` starts and which
  catches SIGTERM itself (no Python handler goes over it): every process asks
  `reached_preemption_sync_point(step)` at every step and all get True at the
  same one, the largest step any process had reached plus one
  (jax.experimental.multihost_utils; orbax's CheckpointManager uses it too). A
  Ctrl-C there sends its own process a SIGTERM, which JAX takes as that
  process's preemption notice: a Ctrl-C to any or all processes stops them all
  at one step. Only the processes that got it raise `Interrupted` (exit 130).

  `interrupted`: this process got a Ctrl-C. A SIGINT that was ignored when the
  run started (`nohup`, a background job of a shell script) stays ignored.

  Args:
    before_exit: called before a second Ctrl-C ends the process (releases the
      run directory's lock: `os._exit` runs no `finally`).
  """

  def __init__(self, before_exit: Callable[[], None] | None = None):
    self._before_exit = before_exit

  def __enter__(self) -> Preemption:
    self._flag = False
    self.interrupted = False
    self._several = jax.process_count() > 1
    self._previous = {}
    if not self._several:
      self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_sigterm)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
      self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_sigint)
    return self

  def _on_sigterm(self, signum, frame):
    self._flag = True

  def _on_sigint(self, signum, frame):
    if self.interrupted:
      os.write(2, SECOND_CTRL_C.encode())
      if self._before_exit is not None:
        self._before_exit()
      os._exit(130)
    self.interrupted = True
    if self._several:
      os.kill(os.getpid(), signal.SIGTERM)  # to JAX's preemption notifier
    else:
      self._flag = True

  def reached(self, step: int) -> bool:
    """Whether to save after `step` and stop; every process calls it at every step."""
    if self._several:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._flag

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      # None: the previous handler was not Python's (jax.distributed's SIGTERM
      # handler, in a run of one process); the loop is over, so the default will do.
      signal.signal(signum, signal.SIG_DFL if previous is None else previous)
