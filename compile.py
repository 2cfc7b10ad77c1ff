r"""Compiles a config's train and eval steps for a TPU slice or GPUs this machine lacks.

  python compile.py --config=configs/shakespeare_char.py:preset=nanogpt --target=tpu-v5e-8 \
      --config.model.dtype=bfloat16 --config.mesh.fsdp=8 --out=r.json
  python compile.py --config=configs/gpt2.py:preset=small --target=gpu-h100x8 \
      --config.model.dtype=bfloat16 --config.mesh.fsdp=8 --tokens=10e9

Targets: tpu-v4-8, tpu-v5e-8, tpu-v5e-256, tpu-v5p-8, tpu-v5p-128, tpu-v6e-8,
tpu-v6e-64, gpu-h100x1, gpu-h100x8, cpu (attnscale/runtime/aot.py). Prints one table
(per-device memory against the device's, whether it fits, the attention kernel,
the collectives, FLOPs, a roofline lower bound on the step time) and writes the
same as JSON to --out; --tokens=N adds the best-case time to train N tokens (the
roofline step time x the steps: a lower bound). A program that does not fit the
device exits 1 after the table, with one line saying by how much and why
(--norequire_fit: exit 0, for scripts that collect every row). TPU targets need
`pip install -e ".[tpu]"`, GPU targets `".[cuda12]"` (JAX 0.12, Python >= 3.12); run
with JAX_PLATFORMS=cpu on a machine
without the accelerator (this script sets it when unset). What is compiled is
not run: docs say what that does and does not verify (docs/guides/pods-and-gpus.md).
"""

import os

# A TPU or GPU program is compiled, never run: the host's CPU is the only backend
# JAX needs (and a plugin must not look for a device it would fail to open). Set
# before anything imports JAX.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402
import json  # noqa: E402

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from attnscale.runtime import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:arg].",
                                          lock_config=True)
_TARGET = flags.DEFINE_string("target", None, "What to compile for: tpu-v5e-8, gpu-h100x8, "
                              "cpu, ... (attnscale.runtime.aot.TARGETS).")
_OUT = flags.DEFINE_string("out", None, "Also write the report to this JSON file.")
_TOKENS = flags.DEFINE_float("tokens", None, "Also print the best-case time to train this many "
                             "tokens on the target (a lower bound: roofline step time x steps).")
_REQUIRE_FIT = flags.DEFINE_bool(
    "require_fit", True, "Exit 1 when a step does not fit the device (after the table and "
    "--out); --norequire_fit exits 0 whatever fits, for tables that want every row.")
flags.mark_flags_as_required(["config", "target"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from attnscale.runtime import aot
  if _TOKENS.value is not None and _TOKENS.value <= 0:
    cli.fail(f"--tokens must be > 0, got {_TOKENS.value:g}")
  try:
    aot.target(_TARGET.value)  # an unknown target fails before any compiling
    report = aot.compile_report(_CONFIG.value, _TARGET.value)
  except ValueError as e:
    cli.fail(str(e))
  print(aot.format_report(report))
  if _TOKENS.value:
    config = _CONFIG.value
    report["training_time"] = aot.training_time(report, int(_TOKENS.value),
                                                config.batch_size * config.seq_len)
    print(aot.format_training_time(report["training_time"], _TARGET.value))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(report, f, indent=2, default=str)
    print(f"wrote {_OUT.value}")
  if _REQUIRE_FIT.value and not report["fits"]:
    cli.fail(aot.not_fitting(report) + " (--norequire_fit to exit 0)")


parse_flags = functools.partial(cli.parse_flags, config_flag="config")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
