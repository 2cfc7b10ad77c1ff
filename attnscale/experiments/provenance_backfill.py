"""Writes `pack_size` and `slot` into the provenance records of runs that predate them.

Since packing recorded them, each start's record in provenance.json
(attnscale/runtime/provenance.py) says how many runs shared its compiled program
(`pack_size`) and the run's place in it (`slot`). Older records do not, though
most of them show both, read in this order:

  * `--pack_size=R` on the packed trainer's command line: R;
  * `--runs=[...]` on it (the pack's configs and workdirs, in slot order): its
    length, the trainer's default of one slot per config (no record without
    `pack_size` comes from a commit whose trainer padded a pack it was not asked
    to: padding came with the field), and the slot of the run's directory in it;
  * `pack` (the pack's run directories, in slot order): the same from it;
  * a command line of train.py itself: 1 and 0 (its one-slot program);
  * else "unknown" for either.

A record given the fields here also gets `"recovered": ["pack_size", "slot"]`, so
that a reader can tell them from what training wrote. A record that has them is
left as it is; so is the rest of the file (json.dump, indent 2, as training
writes it), and every other column of the store.

    python -m attnscale.experiments.provenance_backfill docs/results/bert/runs.parquet ...

The store is rewritten whole (`results_store._write`: a temporary file renamed
over it, under the store's lock), only where a record changed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence

from attnscale.experiments import results_store

UNKNOWN = "unknown"
RECOVERED = ["pack_size", "slot"]
TRAIN = ("train.py", "attnscale-train")


def _names(paths: Sequence[str]) -> list[str]:
  return [os.path.basename(os.path.normpath(str(p))) for p in paths]


def _runs_arg(argv: Sequence[str]) -> list[str] | None:
  """The workdirs of `--runs=JSON` in slot order, None without it (or unreadable)."""
  for a in argv:
    if str(a).startswith("--runs="):
      try:
        return [r["workdir"] for r in json.loads(str(a)[len("--runs="):])]
      except (ValueError, KeyError, TypeError):
        return None
  return None


def recover(record: dict, run: str) -> tuple[object, object]:
  """(pack_size, slot) that `record`, a start of the run named `run`, shows
  (module docstring); UNKNOWN for what it does not show."""
  argv = [str(a) for a in record.get("argv") or []]
  size = next((int(m.group(1)) for a in argv if (m := re.fullmatch(r"--pack_size=(\d+)", a))),
              None)
  members = _runs_arg(argv)
  if members is None and record.get("pack"):
    members = list(record["pack"])
  if members is not None:
    names = _names(members)
    slot = names.index(run) if names.count(run) == 1 else UNKNOWN
    return (size if size is not None else len(members)), slot
  if size is not None:
    return size, UNKNOWN
  if argv and os.path.basename(argv[0]) in TRAIN:
    return 1, 0
  return UNKNOWN, UNKNOWN


def backfill_text(text: str | None, run: str) -> str | None:
  """provenance.json's text with the fields added to each record that lacks
  `pack_size`; the text itself where none does (or it is not a list of records)."""
  if not text:
    return text
  records = json.loads(text)
  if not isinstance(records, list) or all("pack_size" in r for r in records):
    return text
  out = []
  for r in records:
    if "pack_size" not in r:
      size, slot = recover(r, run)
      r = {**r, "pack_size": size, "slot": slot, "recovered": RECOVERED}
    out.append(r)
  return json.dumps(out, indent=2)


def backfill(store: str) -> int:
  """Backfills every run of `store`; returns the number of runs changed (the store
  is rewritten only when that is not 0)."""
  with results_store._Locked(store):  # noqa: SLF001
    rows = results_store._read_rows(store)  # noqa: SLF001
    changed = 0
    for row in rows:
      new = backfill_text(row.get("provenance.json"), row["run"])
      if new != row.get("provenance.json"):
        row["provenance.json"] = new
        changed += 1
    if changed:
      results_store._write(results_store._table(rows), store)  # noqa: SLF001
  return changed


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("stores", nargs="+", help=f"store files (X{results_store.SUFFIX})")
  args = p.parse_args(argv)
  for store in args.stores:
    print(f"{store}: {backfill(store)} runs backfilled")
  return 0


if __name__ == "__main__":
  sys.exit(main())
