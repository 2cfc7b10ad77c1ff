"""`config.profile_steps`: a jax.profiler trace of a few steps of a real run.

  python train.py --config=configs/shakespeare_char.py:preset=cpu --workdir=runs/p \
      --config.profile_steps=20:25

traces steps 21 to 25 as the progress lines number them (the trace starts once
START steps are done and stops when step STOP has finished on the device; 0:N
includes the first step's compilation). The trace goes to
WORKDIR/tensorboard/plugins/profile/<time>/ (`<host>.xplane.pb`, which
TensorBoard's profile plugin and XProf read: `tensorboard --logdir
WORKDIR/tensorboard`, Profile tab, trace viewer) with `<host>.trace.json.gz`
beside it, a Chrome trace that ui.perfetto.dev opens. (Not jax's
create_perfetto_trace: converting took two minutes of a `test`-preset run.) How to read it: docs/guides/training.md,
"Profiling a few steps". "" (the default) traces nothing.
"""

from __future__ import annotations

import atexit
import os

import jax

_tracing: set[str] = set()  # workdirs whose trace is running in this process
_traced: set[str] = set()  # workdirs traced (or tracing) in this process: once each


def trace_dir(workdir: str) -> str:
  """Where the traces go: TensorBoard's profile plugin finds them under its logdir."""
  return os.path.join(workdir, "tensorboard")


def at_step(steps: tuple[int, int] | None, workdir: str, step: int, state) -> None:
  """Called before each step of the training loop with the steps done so far and
  the run's `RunConfig.profile_window` (start, stop) (None: off; read from
  config.profile_steps by `attnscale.config.validation.profile_window`): starts the
  trace at START, stops it (after `state` is computed) at STOP."""
  if steps is None or jax.process_index() != 0:
    return
  start, stop = steps
  if workdir not in _traced and start <= step < stop:
    jax.block_until_ready(state)  # the steps before START stay out of the trace
    options = jax.profiler.ProfileOptions()
    # No Python tracer: every Python call of the host loop would be an event (15 MB for
    # five `test`-preset steps); XLA's ops and the host threads remain.
    options.python_tracer_level = 0
    jax.profiler.start_trace(trace_dir(workdir), profiler_options=options)
    _traced.add(workdir)
    _tracing.add(workdir)
    print(f"profiling steps {step + 1}-{stop} into {trace_dir(workdir)}/plugins/profile",
          flush=True)
  elif workdir in _tracing and step >= stop:
    jax.block_until_ready(state)  # the traced steps' device work, to the end
    _stop(workdir)


def _stop(workdir: str) -> None:
  jax.profiler.stop_trace()
  _tracing.discard(workdir)


@atexit.register
def _stop_unfinished() -> None:
  """A run that stopped inside the range (Ctrl-C, SIGTERM, an error): its trace is still
  written."""
  for workdir in list(_tracing):
    _stop(workdir)


def __getattr__(name):
  if name == "parse":
    raise AttributeError("attnscale.runtime.profiling.parse is "
                         "attnscale.config.validation.profile_window")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
