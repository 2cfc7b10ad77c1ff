"""Command line: `python -m attnscale.studies NAME --out DIR`, NAME one of STUDIES or all.

Each study writes DIR/NAME.png, DIR/NAME.csv and DIR/NAME.md (its parameters,
headline and table). Seeded: the same command writes the same tables.

  python -m attnscale.studies all --out studies_out --workdirs runs/a runs/b
  python -m attnscale.studies key_norms --out out --dist student_t --df 3
  python -m attnscale.studies output_scale --out out --max-n 1024 --causal-len 256
  python -m attnscale.studies length --out out --workdirs runs/length/*
  python -m attnscale.studies shared_kv --out out --workdirs runs/shared_kv runs/shared_kv_cpu
  python -m attnscale.studies width --out out --workdirs runs/width
  python -m attnscale.studies depth --out out --workdirs runs/depth
  python -m attnscale.studies sensitivity --out out --workdirs runs/sensitivity
  python -m attnscale.studies coord_check --config=configs/shakespeare_char.py:preset=graphcore_cpu \
      --widths=32,64,128,256,512 --steps=4 --out=docs/results/width
  python -m attnscale.studies coord_check --depths=2,4,8,16,32 --steps=4 --out=docs/results/depth
"""

from __future__ import annotations

import argparse
import math
import sys

from attnscale import studies
from attnscale.core import scalings
from attnscale.experiments import reporting
from attnscale.studies import coord_check, key_norm_kde
from attnscale.studies import length as length_study
from attnscale.studies import precision as precision_study
from attnscale.studies import sensitivity as sensitivity_study
from attnscale.studies import shared_kv as shared_kv_study
from attnscale.studies import width as width_study

STUDIES = ("output_scale", "temperature", "key_norms", "trained", "length", "precision",
           "shared_kv", "width", "depth", "sensitivity", "coord_check")
RUN_STUDIES = ("trained", "length", "precision", "shared_kv", "width", "depth",
               "sensitivity")  # need --workdirs


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
  return tuple(2**i for i in range(int(math.log2(lo)), int(math.log2(hi)) + 1))


def _write(fig, rows, out, name, title, notes):
  """Writes the study's PNG, CSV and Markdown; returns (paths, notes)."""
  paths = [reporting.save_figure(fig, out, name)]
  return paths + reporting.write_tables(rows, out, name, title=title, notes=notes), notes


def run_output_scale(a):
  fns = studies.default_scalings()
  if a.scalings and not {"standard", "fully_scaled"} <= set(a.scalings):
    raise SystemExit("output_scale: --scalings must include standard and fully_scaled "
                     "(the headline)")
  n_values = _powers_of_two(a.min_n, a.max_n)
  scale_fns = {name: fns[name] for name in a.scalings} if a.scalings else fns
  r = studies.output_scale(n_values, d=a.d, scale_fns=scale_fns,
                           queries=a.queries_per_sequence, batch=a.batch,
                           heads=a.heads, causal_len=min(a.causal_len, a.max_n),
                           causal_batch=a.batch * 2, seed=a.seed)
  n = 256 if 256 in n_values else n_values[len(n_values) // 2]
  i = n_values.index(n)
  notes = [f"q, k, v ~ N(0, 1), d = {r.d}, seed = {r.seed}, sizes {r.sizes}.",
           f"Headline (bidirectional, n = {n}): standard {r.std['standard'][i]:.4f} "
           f"(theory sqrt(e/n) = {math.sqrt(math.e / n):.4f}), "
           f"fully_scaled {r.std['fully_scaled'][i]:.4f} (theory 1).",
           "theory: Graphcore's large-n rule per scaling where one exists; causal_pooled "
           "pools the per-position rule sqrt(min(1, e/n_i)) over positions."]
  return _write(studies.plot_output_scale(r), r.rows(), a.out, "output_scale",
                "Attention output std against n", notes)


def run_temperature(a):
  temperatures = tuple(2.0**(i / 2) for i in range(-8, 9))
  r = studies.temperature_sweep(temperatures, a.temperature_n, d=a.d,
                                queries=a.queries_per_sequence, batch=a.batch, heads=a.heads,
                                seed=a.seed)
  rows = r.rows()
  worst = max(abs(row["std_over_theory"] - 1) for row in rows if row["t"] >= 1)
  notes = [f"standard attention, logits divided by t; q, k, v ~ N(0, 1), d = {r.d}, "
           f"seed = {r.seed}.",
           f"Largest |std / theory - 1| for t >= 1: {worst:.3f} (theory sqrt(exp(t^-2)/n)). "
           "Below t = 1 the softmax saturates and the theory does not apply."]
  return _write(studies.plot_temperature(r), rows, a.out, "temperature",
                "Attention output std against softmax temperature", notes)


def run_key_norms(a):
  params = {"student_t": {"df": a.df}, "nonzero_mean": {"mean": a.mean},
            "unequal_lengths": {"length_range": tuple(a.length_range)}}.get(a.dist, {})
  r = studies.key_norms(a.dims, queries=a.queries, keys=a.keys, dist=a.dist, seed=a.seed,
                        **params)
  notes = [f"{r.keys} keys drawn once and shared by {r.queries} queries; q, k components "
           f"iid {a.dist}{' ' + str(params) if params else ''}, seed = {r.seed}.",
           "Statistics of the first key's logit (raw dot product) or attention weight across "
           "queries; skewness and excess kurtosis are 0 for a Gaussian."]
  return _write(studies.plot_key_norms(r), r.rows(), a.out, "key_norms",
                "Key-norm simulations (Bernhard 2023)", notes)


def run_trained(a):
  if not a.workdirs:
    raise SystemExit("trained: give one or more --workdirs (train.py run directories)")
  r = studies.trained_diagnostics(a.workdirs, recompute=a.recompute)
  notes = ["Per-layer attention statistics on the first validation batch "
           "(eval.py's diagnostics); per head in trained_heads.csv / .md, per run "
           "over layers and heads in trained_summary.csv / .md."]
  heads = reporting.write_tables(r.head_rows(), a.out, "trained_heads",
                                 title="Attention diagnostics per head")
  heads += reporting.write_tables(r.summary_rows(), a.out, "trained_summary",
                                  title="Attention diagnostics per run, over layers and heads")
  paths, notes = _write(studies.plot_trained(r), r.rows(), a.out, "trained",
                        "Attention diagnostics of trained runs", notes)
  return paths + heads, notes


def run_length(a):
  try:
    r = length_study.length_study(a.workdirs)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  first, last = r.lengths[0], r.lengths[-1]
  notes = [f"{len(r.runs)} runs; validation loss (nats/char) over the whole split at each "
           f"evaluation length (eval.py --lengths), mean ± standard error over seeds.",
           f"Last column: loss at {last} minus loss at {first} (how much worse the model "
           "gets with longer windows; negative = longer context helps).",
           "Per-run values: length_runs.csv."]
  paths = reporting.write_tables(r.rows(), a.out, "length_runs", title="Length study, every run")
  written, notes = _write(length_study.plot_length(r), r.summary_rows(), a.out, "length",
                          "Loss against evaluation length", notes)
  return written + paths, notes


RUNNERS = {"output_scale": run_output_scale, "temperature": run_temperature,
           "key_norms": run_key_norms, "trained": run_trained, "length": run_length,
           "precision": precision_study.run_cli, "shared_kv": shared_kv_study.run_cli,
           "width": width_study.run_cli, "depth": width_study.run_depth_cli,
           "sensitivity": sensitivity_study.run_cli,
           "coord_check": coord_check.run_cli}


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m attnscale.studies", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("study", choices=STUDIES + ("all",),
                 help="the study to run; all = every synthetic study, and trained and "
                      "length when --workdirs is given")
  p.add_argument("--out", required=True, help="directory for the PNG, CSV and Markdown files")
  p.add_argument("--seed", type=int, default=0, help="jax.random.key(seed) for every draw")
  g = p.add_argument_group("output_scale and temperature")
  g.add_argument("--min-n", type=int, default=16, help="smallest n (a power of 2)")
  g.add_argument("--max-n", type=int, default=4096, help="largest n (a power of 2)")
  g.add_argument("--causal-len", type=int, default=1024,
                 help="longest causal sequence (costs batch*2 * heads * L^2 logits)")
  g.add_argument("--scalings", nargs="+", choices=scalings.names(), default=None,
                 help="registered scalings to include (default: all, with default params)")
  g.add_argument("--d", type=int, default=64, help="head dim")
  g.add_argument("--batch", type=int, default=4, help="independent sequences")
  g.add_argument("--heads", type=int, default=8, help="heads per sequence")
  g.add_argument("--queries-per-sequence", type=int, default=64,
                 help="queries per sequence in the bidirectional runs")
  g.add_argument("--temperature-n", type=int, nargs="+", default=[64, 256, 1024],
                 help="numbers of keys for the temperature sweep")
  g = p.add_argument_group("key_norms")
  g.add_argument("--dims", type=int, nargs="+", default=[16, 256], help="head dims d")
  g.add_argument("--queries", type=int, default=500, help="queries")
  g.add_argument("--keys", type=int, default=32, help="keys (drawn once, shared)")
  g.add_argument("--dist", choices=key_norm_kde.DISTRIBUTIONS, default="normal",
                 help="distribution of the q and k components")
  g.add_argument("--df", type=float, default=3.0, help="student_t degrees of freedom")
  g.add_argument("--mean", type=float, default=1.0, help="nonzero_mean: the mean")
  g.add_argument("--length-range", type=float, nargs=2, default=[0.5, 2.0],
                 help="unequal_lengths: key lengths ~ U(lo, hi)")
  g = p.add_argument_group("coord_check (trains: never part of all)")
  g.add_argument("--config", default="configs/shakespeare_char.py:preset=graphcore_cpu",
                 help="the train.py config (FILE.py[:ARG]) trained at each width")
  g.add_argument("--widths", default="32,64,128,256,512",
                 help="comma-separated model widths (num_heads must divide each)")
  g.add_argument("--depths", default=None,
                 help="comma-separated depths (num_layers): the depth check, sp against "
                      "the depth rule (model.depth_alpha 1 and 1/2), instead of --widths")
  g.add_argument("--steps", type=int, default=4, help="training steps recorded at each size")
  g = p.add_argument_group("trained and length")
  g.add_argument("--workdirs", nargs="+", default=[], help="train.py run directories")
  g.add_argument("--recompute", action="store_true",
                 help="ignore eval.json and compute from the latest checkpoint")
  args = p.parse_args(argv)
  for name in ("min_n", "max_n"):
    n = getattr(args, name)
    if n < 1 or n & (n - 1):
      p.error(f"--{name.replace('_', '-')} must be a power of 2, got {n}")
  if args.min_n > args.max_n:
    p.error(f"--min-n ({args.min_n}) must be <= --max-n ({args.max_n})")
  return args


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  names = [args.study] if args.study != "all" else [
      s for s in STUDIES if s not in RUN_STUDIES or args.workdirs]
  if "length" in names and args.study == "all" and not all(
      map(length_study.has_lengths, args.workdirs)):
    names.remove("length")  # the runs were evaluated without --lengths
  # Only when asked for: precision tracks every checkpoint, the sweeps' studies read
  # one sweep's layout, coord_check trains models.
  for name in ("precision", "shared_kv", "width", "depth", "sensitivity", "coord_check"):
    if args.study == "all" and name in names:
      names.remove(name)
  for name in names:
    paths, notes = RUNNERS[name](args)
    print("\n  ".join([f"{name}:"] + notes + paths))


if __name__ == "__main__":
  main()
