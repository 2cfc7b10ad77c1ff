"""Per-device parameter + optimizer memory under FSDP (`config.mesh.fsdp`).

    python benchmarks/memory.py                      # nanogpt and gpt2_small, fsdp 1 and 8
    python benchmarks/memory.py --devices 16 --fsdp 1,4,16

For each model and fsdp count, the train state's bytes on one device: counted
from each array's shard shape under `train_state.state_shardings` (parameters,
AdamW's two moments, the rest), and the compiled initialisation's output size
(`jax.jit(...).lower().compile().memory_analysis()`, XLA's own count of what one
device holds after `train_state.create_state`). Nothing is allocated: shapes come
from `jax.eval_shape`, and the compiled program is never run, so GPT-2 small's
124M parameters fit in any laptop's memory. On a CPU the devices are --devices
fake ones (XLA_FLAGS=--xla_force_host_platform_device_count, set here before JAX
starts); on GPUs/TPUs, the real ones.

Models: `nanogpt` (the shakespeare_char preset: 6 x 384, 6 heads, block 256,
vocabulary 65) and `gpt2_small` (GPT-2 small's shapes: 12 x 768, 12 heads,
block 1024, vocabulary 50257, tied embedding). The bytes do not depend on the
data, so nothing is loaded.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

MiB = 2**20

MODELS = {
    "nanogpt": ("preset=nanogpt", {}),
    "gpt2_small": ("preset=nanogpt", {"model.vocab_size": 50257, "model.block_size": 1024,
                                      "model.num_layers": 12, "model.num_heads": 12,
                                      "model.width": 768, "seq_len": 1024}),
}


def measure(name: str, fsdp: int) -> dict:
  """Per-device bytes of the train state of model `name` at this fsdp count."""
  import jax
  import numpy as np

  from attnscale.runtime import train_state as ts
  from configs import shakespeare_char

  arg, overrides = MODELS[name]
  config = shakespeare_char.get_config(arg)
  config.update_from_flattened_dict({**overrides, "mesh.fsdp": fsdp})
  mesh = ts.make_mesh(config)
  shapes = ts.state_shapes(config)
  shardings = ts.state_shardings(shapes, mesh)

  def device_bytes(tree, tree_shardings):
    return sum(int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize
               for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(tree_shardings)))

  compiled = jax.jit(ts.init_fn(config), out_shardings=shardings).lower().compile()
  stats = compiled.memory_analysis()
  rest = {k: v for k, v in shapes.items() if k not in ("params", "opt_state")}
  return {
      "model": name,
      "params": sum(x.size for x in jax.tree.leaves(shapes["params"])),
      "data": mesh.shape["data"], "fsdp": fsdp,
      "params_bytes": device_bytes(shapes["params"], shardings["params"]),
      "opt_bytes": device_bytes(shapes["opt_state"], shardings["opt_state"]),
      "rest_bytes": device_bytes(rest, {k: shardings[k] for k in rest}),
      "compiled_bytes": None if stats is None else stats.output_size_in_bytes,
  }


def table(rows: list[dict]) -> str:
  lines = ["| model | params | data x fsdp | params MiB | optimizer MiB | total MiB "
           "| compiled MiB | total / fsdp 1 |", "|---|---:|---|---:|---:|---:|---:|---:|"]
  base = {r["model"]: r for r in rows if r["fsdp"] == 1}
  for r in rows:
    total = r["params_bytes"] + r["opt_bytes"] + r["rest_bytes"]
    ref = base.get(r["model"])
    ratio = (f"{total / (ref['params_bytes'] + ref['opt_bytes'] + ref['rest_bytes']):.3f}"
             if ref else "")
    compiled = "" if r["compiled_bytes"] is None else f"{r['compiled_bytes'] / MiB:.1f}"
    lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['data']} x {r['fsdp']} "
                 f"| {r['params_bytes'] / MiB:.1f} | {r['opt_bytes'] / MiB:.1f} "
                 f"| {total / MiB:.1f} | {compiled} | {ratio} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default=",".join(MODELS),
                      help=f"comma-separated, of {', '.join(MODELS)}")
  parser.add_argument("--fsdp", default="1,8", help="comma-separated fsdp counts")
  parser.add_argument("--devices", type=int, default=8,
                      help="fake CPU devices (ignored on GPUs/TPUs)")
  args = parser.parse_args(argv)
  # Before JAX starts: the CPU backend's device count is fixed then.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={args.devices}")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
  import jax

  models = args.models.split(",")
  unknown = [m for m in models if m not in MODELS]
  if unknown:
    sys.exit(f"error: --models: {unknown} not in {list(MODELS)}")
  rows = [measure(m, int(f)) for m in models for f in args.fsdp.split(",")]
  device = jax.devices()[0]
  print(f"# {device.platform}: {jax.device_count()} devices ({platform.machine()}), "
        f"JAX {jax.__version__}, AdamW, float32 parameters and moments; MiB per device")
  print(table(rows))


if __name__ == "__main__":
  main()
