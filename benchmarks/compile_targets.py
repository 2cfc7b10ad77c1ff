"""The table of compiled programs: presets x targets, compiled on this CPU
(docs/guides/pods-and-gpus.md; committed output in docs/results/compile/).

    python benchmarks/compile_targets.py                 # nanogpt, gpt2_small x 3 targets
    python benchmarks/compile_targets.py --targets tpu-v5e-8 --models nanogpt --remat none,full
    python benchmarks/compile_targets.py --scalings --targets tpu-v5e-8 --models nanogpt

Each row is `compile.py`'s report of one train step (attnscale/runtime/aot.py) in bf16 with
every device on fsdp: per-device memory against the device's (a row that does not fit
says why, and the table goes on), the attention kernel,
the collectives, FLOPs and the roofline lower bound. `--scalings`: instead, every
registered scaling's compiled FLOPs and per-device memory against standard's. Nothing runs on a chip: the
step time is an estimate. Needs libtpu and the CUDA plugin
(`pip install -e ".[tpu,cuda12-compile]"`, JAX 0.12).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compiled for the targets, run nowhere
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GiB = 2**30
# model -> (config argument, overrides): batch 64 x 256 (nanoGPT's) and 8 x 1024.
MODELS = {
    "nanogpt": ("preset=nanogpt", {}),
    "gpt2_small": ("preset=nanogpt", {"model.vocab_size": 50257, "model.block_size": 1024,
                                      "model.num_layers": 12, "model.num_heads": 12,
                                      "model.width": 768, "seq_len": 1024, "batch_size": 8,
                                      "model.dropout": 0.0}),
}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--targets", default="tpu-v5e-8,tpu-v5p-128,gpu-h100x8")
  parser.add_argument("--scaling", default="standard")
  parser.add_argument("--remat", default="none")
  parser.add_argument("--scalings", action="store_true",
                      help="every scaling's FLOPs and memory against standard's")
  args = parser.parse_args()
  if args.scalings:
    return scaling_table(args.models.split(",")[0], args.targets.split(",")[0])

  import jax

  from attnscale.runtime import aot, aot_report
  from configs import shakespeare_char

  print(f"# compiled on {jax.devices()[0].platform} (no accelerator), JAX {jax.__version__}; "
        f"train step, bf16, data 1 x fsdp = all devices; per device")
  print("| model | target | remat | params + opt | temporaries | total / HBM | fits | kernel "
        "| all-gather / reduce-scatter / all-reduce / all-to-all | TFLOPs (XLA) "
        "| step >= (roofline) | best MFU |")
  print("|---|---|---|---:|---:|---:|---|---|---|---:|---:|---:|")
  for model in args.models.split(","):
    for target in args.targets.split(","):
      for remat in args.remat.split(","):
        arg, overrides = MODELS[model]
        config = shakespeare_char.get_config(f"{arg},scaling={args.scaling}")
        n = len(aot.devices(target))
        config.update_from_flattened_dict({**overrides, "model.dtype": "bfloat16",
                                           "mesh.data": 1, "mesh.fsdp": n, "remat": remat})
        if config.batch_size % n:
          config.batch_size = n * -(-config.batch_size // n)
        r = aot.compile_report(config, target)
        row, mem = r["train_step"], r["train_step"]["memory"]
        c = row.get("collectives", {})
        flops = row.get("flops", {}).get("compiled_per_device")
        roof = row.get("roofline", {})
        cells = [model, f"{target} ({n} {'GPUs' if r['platform'] == 'gpu' else 'chips'})",
                 remat, aot_report.format_bytes(mem["parameters"] + mem["optimizer_state"]),
                 aot_report.format_bytes(mem.get("temporaries") or 0),
                 f"{mem['total'] / GiB:.2f} / {r['device_memory_bytes'] / GiB:.0f} GiB",
                 "yes" if mem["fits"] else f"no: {row['why']}", row.get("kernel", "-"),
                 " / ".join(str(c[k]) for k in ("all-gather", "reduce-scatter", "all-reduce",
                                                "all-to-all")) if c else "-",
                 f"{flops / 1e12:.3f}" if flops else "-",
                 f"{roof['step_s_lower_bound'] * 1e3:.2f} ms" if roof else "-",
                 f"{roof['best_mfu']:.0%}" if roof.get("best_mfu") else "-"]
        print("| " + " | ".join(cells) + " |", flush=True)


def scaling_table(model: str, target: str):
  """Each registered scaling's train step against standard's, on one target."""
  import jax

  from attnscale.core import scalings
  from attnscale.runtime import aot
  from configs import shakespeare_char

  print(f"# {model} on {target}, compiled on {jax.devices()[0].platform} (JAX "
        f"{jax.__version__}); train step, bf16, fsdp = every device; ratios to standard")
  print("| scaling | kernel | FLOPs / standard | memory per device / standard |")
  print("|---|---|---:|---:|")
  base = None
  for name in ["standard", *[n for n in scalings.names() if n != "standard"]]:
    arg, overrides = MODELS[model]
    config = shakespeare_char.get_config(f"{arg},scaling={name}")
    n = len(aot.devices(target))
    config.update_from_flattened_dict({**overrides, "model.dtype": "bfloat16",
                                       "mesh.data": 1, "mesh.fsdp": n})
    row = aot.compile_report(config, target)["train_step"]
    flops = row["flops"]["compiled_per_device"] or row["flops"]["analytic_per_device"]
    base = base or (flops, row["memory"]["total"])
    print(f"| {name} | {row['kernel']} | {flops / base[0]:.3f} | "
          f"{row['memory']['total'] / base[1]:.3f} |", flush=True)


if __name__ == "__main__":
  main()
