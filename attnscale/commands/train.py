r"""attnscale-train: trains a model from a config; resumes from the latest checkpoint in --workdir.

  attnscale-train --config=shakespeare_char.py:preset=cpu,scaling=key_norm_sum \
      --workdir=runs/char_cpu --config.num_train_steps=2000

The same command as `python train.py ...` at the repository root (train.py's
docstring says more: several processes, errors, Ctrl-C). --config is a path from
the current folder or a name in the project's configs/ (shakespeare_char.py,
shakespeare_char); config.imports are the user's own modules, imported first
(their files are recorded in WORKDIR/provenance.json, so eval finds them from
any folder).
"""

import functools
import json
import sys
import time
import types

from absl import app, flags, logging
from ml_collections import config_flags

from attnscale.runtime import cli


def define_flags() -> types.SimpleNamespace:
  """Defines the command's flags (absl's global FLAGS); returns their holders."""
  holders = types.SimpleNamespace(
      config=config_flags.DEFINE_config_file(
          "config", None, "Config file[:arg]: a path, or a name in the project's configs/ "
          "(shakespeare_char.py:preset=test).", lock_config=True),
      workdir=flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics)."),
      force_lock=flags.DEFINE_bool(
          "force_lock", False, "Take WORKDIR/LOCK whoever holds it: for the lock of a run on "
          "another host that is known to be over (docs/guides/training.md, \"Stopping and "
          "resuming\")."),
      data_progress=cli.define_data_progress_flag(),
      multihost=cli.define_multihost_flags(),  # --multihost, --coordinator_address, ...
      # A pack (what sweep.py --pack starts, `packing.command`): several runs in one
      # vmapped program, instead of --config and --workdir.
      runs=flags.DEFINE_string(
          "runs", None, "A pack's runs as JSON: a list of {\"config\": \"FILE:ARG\", "
          "\"overrides\": {field: value}, \"workdir\": DIR}, trained in one program."),
      pack_size=flags.DEFINE_integer(
          "pack_size", None, "With --runs: the program's slots (default: one per run); the "
          "slots past the runs are padding (masked, never written)."))
  return holders


def main(holders: types.SimpleNamespace, argv: list[str]) -> None:
  """Trains `holders.config` in `holders.workdir` (or the pack of `holders.runs`);
  exits with train.py's codes."""
  del argv
  if holders.runs.value is not None:
    return train_pack(holders)
  if holders.config.value is None or holders.workdir.value is None:
    cli.fail("--config and --workdir name the run to train (or --runs a pack of runs)")
  cli.check_workdir(holders.workdir.value)
  cli.set_data_progress(holders.data_progress)
  # Orbax and TFDS log every step of every save at INFO; keep the progress readable.
  logging.set_verbosity(logging.WARNING)
  cli.initialize_multihost(holders.multihost)  # before anything starts JAX's backend
  from attnscale.runtime import interrupts, loop, run_summary, rundir, train_lib
  start = time.perf_counter()
  try:
    train_lib.train_and_evaluate(holders.config.value, holders.workdir.value,
                                 force_lock=holders.force_lock.value)
  except (ValueError, FileNotFoundError, loop.NonFiniteLossError) as e:
    cli.fail(str(e))
  except interrupts.Interrupted:  # Ctrl-C: saved, and said where
    sys.exit(130)
  except KeyboardInterrupt:  # Ctrl-C outside the loop's handler (start-up, the last save)
    cli.stop_after_early_ctrl_c("from the last checkpoint on disk")
  config = holders.config.value
  for line in run_summary.lines(holders.workdir.value, wall_s=time.perf_counter() - start,
                                eval_batches=config.get("eval_batches"),
                                num_train_steps=config.num_train_steps, argv0=sys.argv[0]):
    rundir.log(line)


def train_pack(holders: types.SimpleNamespace) -> None:
  """Trains the runs of `holders.runs` in one packed program (attnscale/runtime/packed.py)."""
  logging.set_verbosity(logging.WARNING)
  from attnscale.runtime import interrupts, packed, packing
  try:
    specs = json.loads(holders.runs.value)
    configs = [packing.load_config(s["config"], s.get("overrides", {})) for s in specs]
    for s in specs:
      cli.check_workdir(s["workdir"])
    results = packed.train_packed(configs, [s["workdir"] for s in specs],
                                  pack_size=holders.pack_size.value,
                                  force_lock=holders.force_lock.value)
  except (ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
    cli.fail(str(e))
  except interrupts.Interrupted:
    sys.exit(130)
  except KeyboardInterrupt:  # start-up or compilation: nothing to save
    cli.stop_after_early_ctrl_c("from the last checkpoints on disk")
  diverged = [s["workdir"] for s, r in zip(specs, results) if r["status"] == "diverged"]
  if diverged:
    cli.fail(f"{len(diverged)} of {len(specs)} runs of the pack stopped on a non-finite loss: "
             + ", ".join(diverged))


def run() -> None:
  """The command line (attnscale-train, train.py): re-executes with the malloc
  tunables first, then parses the flags and trains."""
  cli.reexec_with_tunables()
  holders = define_flags()
  cli.set_help(__doc__, __name__)
  # A bad config argument (e.g. an unknown preset), override or config file fails
  # while the flags are parsed: one line, naming it.
  app.run(functools.partial(main, holders),
          flags_parser=functools.partial(cli.parse_flags, config_flag="config"))


if __name__ == "__main__":  # python -m attnscale.commands.train: what a sweep starts for a pack
  run()
