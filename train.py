r"""Trains a model from a config; resumes from the latest checkpoint in --workdir.

  python train.py --config=configs/shakespeare_char.py:preset=cpu,scaling=key_norm_sum \
      --workdir=runs/char_cpu --config.num_train_steps=2000

From any folder: `attnscale-train` (installed by `pip install -e .`) or
`python /path/to/train.py`, with --config a path from that folder or a name in
the project's configs/ (`--config=shakespeare_char.py:preset=cpu`).

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

More steps on a finished run: raise --config.num_train_steps (a constant learning
rate continues; a decaying schedule is refused, saying why). A new run from
another's parameters: --config.init_from=WORKDIR (optimizer state fresh; what
differs said in one line). --data_progress shows TFDS's progress bars while a
data set is prepared (default: one line).
"""

# The flags and main: attnscale/commands/train.py (also the attnscale-train command).
from attnscale.commands.train import run

if __name__ == "__main__":
  run()
