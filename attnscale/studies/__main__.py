"""Command line: `python -m attnscale.studies NAME --out DIR`, NAME a registered study or all.

Each study writes DIR/NAME.png, DIR/NAME.csv and DIR/NAME.md (its parameters,
headline and table). Seeded: the same command writes the same tables. The
studies and their flags: attnscale/studies/registry.py (one line a study).

  python -m attnscale.studies all --out studies_out --workdirs runs/a runs/b
  python -m attnscale.studies key_norms --out out --dist student_t --df 3
  python -m attnscale.studies output_scale --out out --max-n 1024 --causal-len 256
  python -m attnscale.studies length --out out --workdirs runs/length/*
  python -m attnscale.studies shared_kv --out out --workdirs runs/shared_kv runs/shared_kv_cpu
  python -m attnscale.studies width --out out --workdirs runs/width
  python -m attnscale.studies depth --out out --workdirs runs/depth
  python -m attnscale.studies sensitivity --out out --workdirs runs/sensitivity
  python -m attnscale.studies bert --out docs/results/bert --workdirs runs/bert
  python -m attnscale.studies transfer --out out --workdirs runs/transfer
  python -m attnscale.studies normalisers --out out --workdirs docs/results/normalisers/runs.parquet
  python -m attnscale.studies depth --out out --workdirs docs/results/depth/runs.parquet
  python -m attnscale.studies coord_check --config=configs/shakespeare_char.py:preset=graphcore_cpu \
      --widths=32,64,128,256,512 --steps=4 --out=docs/results/width
  python -m attnscale.studies coord_check --depths=2,4,8,16,32 --steps=4 --out=docs/results/depth
"""

from __future__ import annotations

import argparse
import sys

from attnscale.studies import registry


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m attnscale.studies", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("study", choices=registry.names() + ("all",),
                 help="the study to run; all = every synthetic study, and those that read "
                      "trained runs when --workdirs is given")
  p.add_argument("--out", required=True, help="directory for the PNG, CSV and Markdown files")
  p.add_argument("--seed", type=int, default=0, help="jax.random.key(seed) for every draw")
  p.add_argument("--workdirs", nargs="+", default=[],
                 help="train.py run directories (or a sweep's directory), or a "
                      "results store (docs/results/<study>/runs.parquet[/FOLDER])")
  p.add_argument("--allow_mixed_code", action="store_true",
                 help="studies of trained runs: compare runs made by different commits "
                      "(their provenance.json), saying so under the table; without it, a "
                      "one-line error")
  studies = {name: registry.get(name) for name in registry.names()}
  added = []
  for study in studies.values():  # a flag group shared by studies is added once
    if study.arguments is not None and study.arguments not in added:
      study.arguments(p)
      added.append(study.arguments)
  args = p.parse_args(argv)
  checks = [s.check for name, s in studies.items()
            if s.check is not None and args.study in (name, "all")]
  for check in dict.fromkeys(checks):
    check(args, p)
  return args


def selected(args) -> list[str]:
  """The studies `args.study` names: one, or `all`'s."""
  if args.study != "all":
    return [args.study]
  names = []
  for name in registry.names():
    study = registry.get(name)
    if study.needs_workdirs and not args.workdirs:
      continue
    if callable(study.in_all) and not study.in_all(args) or study.in_all is False:
      continue
    names.append(name)
  return names


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  # A committed store (docs/results/<study>/runs.parquet[/FOLDER]) reads as the
  # folder of runs it was packed from (results_store.workdir: unpacked once here).
  from attnscale.experiments import results_store
  try:
    args.workdirs = results_store.workdirs(args.workdirs)
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"error: --workdirs {e}") from None
  for name in selected(args):
    paths, notes = registry.get(name).run(args)
    print("\n  ".join([f"{name}:"] + notes + paths))


if __name__ == "__main__":
  main()
