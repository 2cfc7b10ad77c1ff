"""How far a packed run is from the same run trained alone: the tolerance of `--pack`.

    python benchmarks/packed_vs_alone.py                       # graphcore_cpu, ~15 min on 2 cores
    python benchmarks/packed_vs_alone.py --preset test --steps 40 --rates 2^-8

Trains every rate x seed twice, as real processes on temporary run directories:
once all together in one pack (`python -m attnscale.commands.train --runs=...`, what
`sweep.py --pack` starts) and once each alone (`train.py`). Prints, per run, the
largest |difference| of the logged training loss over the whole run, the
difference of the final loss (loss_last20, the sweeps' metric) and of the last
validation loss, and, for scale, the spread of the final loss between the seeds
at the same rate. vmap sums in another order than the single run, so the two
start equal to float32 rounding and drift apart as training amplifies it; at a
rate where training is chaotic (near divergence) they drift further.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from attnscale.runtime import hostmem, metrics_writer, packing  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "shakespeare_char.py")


def rate(text: str) -> float:
  return 2.0 ** float(text[2:]) if text.startswith("2^") else float(text)


def curves(run_dir: str) -> tuple[dict[int, float], float, float]:
  """(step -> logged training loss, final loss_last20, last validation loss)."""
  rows = metrics_writer.read_rows(run_dir)
  train = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
  final = [r["train/loss_last20"] for r in rows if "train/loss_last20" in r][-1]
  val = [r["val/loss"] for r in rows if "val/loss" in r][-1]
  return train, final, val


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="graphcore_cpu")
  parser.add_argument("--rates", default="2^-9,2^-5",
                      help="comma list (2^-9: graphcore_cpu's best for standard; 2^-5: near "
                           "its divergence)")
  parser.add_argument("--seeds", default="0,1")
  parser.add_argument("--steps", type=int, default=None, help="default: the preset's")
  args = parser.parse_args()
  hostmem.reexec_with_tunables()
  rates = [rate(r) for r in args.rates.split(",")]
  seeds = [int(s) for s in args.seeds.split(",")]
  tmp = tempfile.mkdtemp(prefix="packed_vs_alone_")
  try:
    specs = []
    for lr in rates:
      for seed in seeds:
        overrides = {"learning_rate": lr} | ({"num_train_steps": args.steps}
                                             if args.steps else {})
        specs.append({"config": f"{CONFIG}:preset={args.preset},seed={seed}",
                      "overrides": overrides, "name": f"lr{lr:g}-seed{seed}"})
    pack = [{"config": s["config"], "overrides": s["overrides"],
             "workdir": os.path.join(tmp, "packed", s["name"])} for s in specs]
    subprocess.run(packing.command(pack, sys.executable), cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    for s in specs:
      subprocess.run([sys.executable, "train.py", f"--config={s['config']}",
                      f"--workdir={os.path.join(tmp, 'alone', s['name'])}"]
                     + [f"--config.{k}={v}" for k, v in s["overrides"].items()],
                     cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    print(f"# {args.preset}, {len(specs)} runs packed together against each alone")
    print("| learning rate | seed | max abs diff of logged loss | final loss (alone) "
          "| diff of final loss | diff of val loss | seed spread of final loss |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    finals = {}
    for s in specs:
      finals[s["name"]] = curves(os.path.join(tmp, "alone", s["name"]))[1]
    for lr in rates:
      spread = [finals[f"lr{lr:g}-seed{seed}"] for seed in seeds]
      for seed in seeds:
        name = f"lr{lr:g}-seed{seed}"
        a_train, a_final, a_val = curves(os.path.join(tmp, "alone", name))
        p_train, p_final, p_val = curves(os.path.join(tmp, "packed", name))
        worst = max(abs(p_train[k] - v) for k, v in a_train.items())
        print(f"| {lr:g} | {seed} | {worst:.2e} | {a_final:.4f} | {p_final - a_final:+.2e} "
              f"| {p_val - a_val:+.2e} | {max(spread) - min(spread):.3f} |", flush=True)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
