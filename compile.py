r"""Compiles a config's train and eval steps for a TPU slice or GPUs this machine lacks.

  python compile.py --config=configs/shakespeare_char.py:preset=nanogpt --target=tpu-v5e-8 \
      --config.model.dtype=bfloat16 --config.mesh.fsdp=8 --out=r.json
  python compile.py --config=configs/gpt2.py:preset=small --target=gpu-h100x8 \
      --config.model.dtype=bfloat16 --config.mesh.fsdp=8 --tokens=10e9
  attnscale-compile --config=gpt2.py:preset=small ...  # the same, from any folder

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

# The flags and main: attnscale/commands/compile.py (also the attnscale-compile command).
from attnscale.commands.compile import run

if __name__ == "__main__":
  run()
