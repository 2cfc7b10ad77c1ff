"""Where a study's runs came from, per label, from its store: the provenance table.

Each run's provenance.json (attnscale/runtime/provenance.py) records the commit,
whether the tree was dirty, the host and, since packing recorded them, the pack
size and the run's slot. The committed stores' older records have them written in
by attnscale/experiments/provenance_backfill.py (marked "recovered"), from their
command lines. A record that still lacks `pack_size` (a store not backfilled) is
read where it allows, in this order:

  * `pack_size` itself (runs since the field existed);
  * the packed trainer's `--pack_size=K` on its command line;
  * the length of `pack` (the pack's run directories; before short packs were
    padded, a pack's size was its number of runs), marked "~" where padding could
    have made the program larger;
  * 1 for a run trained by train.py itself (its command line);
  * else "unknown".

    python -m attnscale.experiments.provenance_table   # every page's section (PAGES)

One row per label (the run's config.label, else the store's `label` column; a run's later starts, a resume, each
count): runs, commits (short, with counts), hosts (CPU model/vector extension, or
the accelerator), pack sizes (with counts), and the runs from a dirty tree.
Each study page (`PAGES`) ends with this section; tests/test_page_numbers.py checks
that it is what this module writes from the committed stores.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from collections.abc import Sequence

from attnscale.experiments import reporting, results_store

UNKNOWN = "unknown"
# Each study page's stores (under docs/results), whose provenance its last section shows.
PAGES = {
    "bert.md": ("bert/runs.parquet",),
    "critical_length.md": ("critical_length/runs.parquet",),
    "graphcore_cpu.md": ("graphcore_cpu/runs.parquet",),
    "length.md": ("length/runs.parquet", "length_2025/runs.parquet"),
    "normalisers.md": ("normalisers/runs.parquet", "normalisers/bert_runs.parquet",
                       "normalisers/sink_hunt.parquet"),
    "practice.md": ("practice/runs.parquet",),
    "probes.md": ("probes/runs.parquet",),
    "precision.md": ("precision/runs.parquet",),
    "sensitivity.md": ("sensitivity/runs.parquet",),
    "shared_kv.md": ("shared_kv/runs.parquet",),
    "transfer.md": ("transfer/runs.parquet", "mup_mults/runs.parquet"),
    "width.md": ("depth/runs.parquet",),
}
BEGIN = ("## Provenance\n\n<!-- provenance: written by `python -m "
         "attnscale.experiments.provenance_table` from the stores; do not edit -->\n")
END = "<!-- provenance: end -->\n"


def _records(text: str | None) -> list[dict]:
  if not text:
    return []
  data = json.loads(text)
  return data if isinstance(data, list) else data.get("records", [data])


def pack_size(record: dict) -> str:
  """The pack size one provenance record shows (module docstring), as text."""
  if "pack_size" in record:
    return str(record["pack_size"])
  argv = record.get("argv") or []
  for a in argv:
    m = re.fullmatch(r"--pack_size=(\d+)", str(a))
    if m:
      return m.group(1)
  if record.get("pack"):
    return f"~{len(record['pack'])}"
  if argv and os.path.basename(str(argv[0])) in ("train.py", "attnscale-train"):
    return "1"
  return UNKNOWN


def host(record: dict) -> str:
  kind = record.get("device_kind", "")
  if kind and kind != "cpu":
    return kind
  cpu = record.get("cpu")
  return f"{cpu}/{record.get('cpu_isa', '?')}" if cpu else "cpu (model unrecorded)"


def _counts(counter: collections.Counter) -> str:
  return ", ".join(f"{k} ({n})" for k, n in sorted(counter.items(), key=lambda kv: (-kv[1],
                                                                                   kv[0])))


def rows(paths: Sequence[str]) -> list[dict]:
  """One row per label over the stores (or STORE/FOLDER) in `paths`; a run counts
  once, by its last start's record."""
  by_label: dict[str, dict] = {}
  for path in paths:
    store, folder = results_store.split(path)
    for r in results_store._read_rows(store, folder,  # noqa: SLF001
                                      columns=["label", "config.json", "provenance.json"]):
      recs = _records(r.get("provenance.json"))
      # The sweep's declared label where the run has one (a store archived by older
      # code may hold the derived one in its column).
      declared = json.loads(r.get("config.json") or "{}").get("label")
      b = by_label.setdefault(declared or r.get("label") or "(unlabelled)", {
          "runs": 0, "commits": collections.Counter(), "hosts": collections.Counter(),
          "pack": collections.Counter(), "dirty": 0, "no_record": 0})
      b["runs"] += 1
      if not recs:
        b["no_record"] += 1
        b["pack"][UNKNOWN] += 1
        continue
      last = recs[-1]
      b["commits"][str(last.get("commit", UNKNOWN))[:7]] += 1
      b["hosts"][host(last)] += 1
      b["pack"][pack_size(last)] += 1
      b["dirty"] += any(rec.get("dirty") for rec in recs)
  return [{"label": label, "runs": b["runs"], "commits": _counts(b["commits"]) or UNKNOWN,
           "hosts": _counts(b["hosts"]) or UNKNOWN, "pack sizes": _counts(b["pack"]),
           "dirty-tree runs": b["dirty"], "no record": b["no_record"]}
          for label, b in sorted(by_label.items())]


def section(stores: Sequence[str], results: str = os.path.join("docs", "results")) -> str:
  """The page's provenance section: a table per store (`rows`)."""
  parts = [BEGIN, "Per label (the one its sweep declared in config.label, else the run's "
           "own scaling name), each run's last provenance.json record "
           "(attnscale/experiments/provenance_table.py). pack sizes: runs sharing one compiled "
           "program, as training recorded it or, for runs before it did, as "
           "their command line shows it (attnscale/experiments/provenance_backfill.py); "
           "'~n' from a pack's list of runs where neither is there (padding may have made "
           "it larger); 'unknown' where the record shows nothing. dirty-tree "
           "runs: started from a checkout with uncommitted code changes. A paired "
           "comparison of two labels that differ here in commit, host or pack size mixes "
           "them.\n"]
  for store in stores:
    parts.append(f"\n`docs/results/{store}`:\n\n" + reporting.to_markdown(
        rows([os.path.join(results, store)]),
        ("label", "runs", "commits", "hosts", "pack sizes", "dirty-tree runs")))
  return "".join(parts) + END


def page_section(text: str) -> str:
  """The provenance section a page holds ("" when none)."""
  if BEGIN not in text:
    return ""
  start = text.index(BEGIN)
  return text[start:text.index(END, start) + len(END)]


def write_pages(pages_dir: str = os.path.join("docs", "experiments"),
                results: str = os.path.join("docs", "results")) -> list[str]:
  """Writes (or rewrites) each page's provenance section, at its end."""
  written = []
  for name, stores in PAGES.items():
    path = os.path.join(pages_dir, name)
    with open(path) as f:
      text = f.read()
    old, new = page_section(text), section(stores, results)
    text = text.replace(old, new) if old else text.rstrip("\n") + "\n\n" + new
    with open(path, "w") as f:
      f.write(text)
    written.append(path)
  return written


def main(argv: Sequence[str] | None = None) -> int:
  argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
  print("\n".join(write_pages()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
