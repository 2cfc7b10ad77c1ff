r"""attnscale-compile: compiles a config's train and eval steps for a TPU slice or GPUs this machine lacks.

  attnscale-compile --config=shakespeare_char.py:preset=nanogpt --target=tpu-v5e-8 \
      --config.model.dtype=bfloat16 --config.mesh.fsdp=8 --out=r.json

The same command as `python compile.py ...` at the repository root (compile.py's
docstring lists the targets and what the report holds). --config is a path from
the current folder or a name in the project's configs/.
"""

import functools
import json
import os
import types

from absl import app, flags, logging
from ml_collections import config_flags

from attnscale.runtime import cli


def define_flags() -> types.SimpleNamespace:
  """Defines the command's flags (absl's global FLAGS); returns their holders."""
  holders = types.SimpleNamespace(
      config=config_flags.DEFINE_config_file(
          "config", None, "Config file[:arg]: a path, or a name in the project's configs/ "
          "(shakespeare_char.py:preset=nanogpt).", lock_config=True),
      target=flags.DEFINE_string("target", None, "What to compile for: tpu-v5e-8, "
                                 "gpu-h100x8, cpu, ... (attnscale.runtime.aot.TARGETS)."),
      out=flags.DEFINE_string("out", None, "Also write the report to this JSON file."),
      tokens=flags.DEFINE_float(
          "tokens", None, "Also print the best-case time to train this many tokens on the "
          "target (a lower bound: roofline step time x steps)."),
      require_fit=flags.DEFINE_bool(
          "require_fit", True, "Exit 1 when a step does not fit the device (after the table "
          "and --out); --norequire_fit exits 0 whatever fits, for tables that want every "
          "row."))
  flags.mark_flags_as_required(["config", "target"])
  return holders


def main(holders: types.SimpleNamespace, argv: list[str]) -> None:
  """Compiles, prints the report; exits 1 when a step does not fit (--require_fit)."""
  del argv
  h = holders
  logging.set_verbosity(logging.WARNING)
  from attnscale.runtime import aot, aot_report
  if h.tokens.value is not None and h.tokens.value <= 0:
    cli.fail(f"--tokens must be > 0, got {h.tokens.value:g}")
  try:
    aot.target(h.target.value)  # an unknown target fails before any compiling
    report = aot.compile_report(h.config.value, h.target.value)
  except ValueError as e:
    cli.fail(str(e))
  print(aot_report.format_report(report))
  if h.tokens.value:
    config = h.config.value
    report["training_time"] = aot_report.training_time(report, int(h.tokens.value),
                                                config.batch_size * config.seq_len)
    print(aot_report.format_training_time(report["training_time"], h.target.value))
  if h.out.value:
    with open(h.out.value, "w") as f:
      json.dump(report, f, indent=2, default=str)
    print(f"wrote {h.out.value}")
  if h.require_fit.value and not report["fits"]:
    cli.fail(aot.not_fitting(report) + " (--norequire_fit to exit 0)")


def run() -> None:
  """The command line (attnscale-compile, compile.py)."""
  # A TPU or GPU program is compiled, never run: the host's CPU is the only backend
  # JAX needs (and a plugin must not look for a device it would fail to open). Set
  # before anything imports JAX.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  holders = define_flags()
  cli.set_help(__doc__, __name__)
  app.run(functools.partial(main, holders),
          flags_parser=functools.partial(cli.parse_flags, config_flag="config"))
