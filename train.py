r"""Trains a model from a config; resumes from the latest checkpoint in --workdir.

  python train.py --config=configs/shakespeare_char.py:preset=cpu,scaling=key_norm_sum \
      --workdir=runs/char_cpu --config.num_train_steps=2000

Several processes (TPU pods, GPU clusters, or two on a laptop): start the same
command in every process with --multihost, which calls jax.distributed.initialize()
(it detects TPU, SLURM and Open MPI clusters); elsewhere add where process 0's
coordinator listens, how many processes there are and which one this is:

  python train.py --config=configs/shakespeare_char.py:preset=test --workdir=runs/two \
      --multihost --coordinator_address=localhost:12355 --num_processes=2 --process_id=0
  (and the same with --process_id=1; docs/guides/pods-and-gpus.md)

A bad flag (a missing config file, an override of a field the config lacks or
of the wrong type, a --workdir that is a file) or a bad config value exits with
one `error: ...` line naming it (attnscale/runtime/cli.py).

Ctrl-C saves a checkpoint after the current step and exits 130 (a second one
exits at once); SIGTERM saves and exits 0. A second train.py on a --workdir in
use stops at start, naming the first (WORKDIR/LOCK; --force_lock takes it).
"""

import functools
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from attnscale.runtime import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:arg].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics).")
_FORCE_LOCK = flags.DEFINE_bool(
    "force_lock", False, "Take WORKDIR/LOCK whoever holds it: for the lock of a run on "
    "another host that is known to be over (docs/guides/training.md, \"Stopping and resuming\").")
_MULTIHOST = cli.define_multihost_flags()  # --multihost, --coordinator_address, ...
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  cli.check_workdir(_WORKDIR.value)
  # Orbax and TFDS log every step of every save at INFO; keep the progress readable.
  logging.set_verbosity(logging.WARNING)
  cli.initialize_multihost(_MULTIHOST)  # before anything starts JAX's backend
  from attnscale.runtime import train_lib
  try:
    train_lib.train_and_evaluate(_CONFIG.value, _WORKDIR.value, force_lock=_FORCE_LOCK.value)
  except (ValueError, FileNotFoundError, train_lib.NonFiniteLossError) as e:
    cli.fail(str(e))
  except train_lib.Interrupted:  # Ctrl-C: saved, and said where
    sys.exit(130)
  except KeyboardInterrupt:  # Ctrl-C outside the loop's handler (start-up, the last save)
    print("Ctrl-C outside the training steps: stopped without saving; rerunning the same "
          "command resumes from the last checkpoint on disk", file=sys.stderr)
    sys.exit(130)


# A bad config argument (e.g. an unknown preset), override or config file fails
# while the flags are parsed: one line, naming it.
parse_flags = functools.partial(cli.parse_flags, config_flag="config")


if __name__ == "__main__":
  from attnscale.runtime import hostmem
  try:
    hostmem.reexec_with_tunables()  # 1.3-2x faster steps on CPU: attnscale/runtime/hostmem.py
  except ValueError as e:  # a bad ATTNSCALE_MALLOC
    sys.exit(f"error: {e}")
  app.run(main, flags_parser=parse_flags)
