"""Backfilling `pack_size` and `slot` into old provenance records
(attnscale/experiments/provenance_backfill.py): what a record's command line shows,
written into the store without touching anything else."""

import json
import os

import pyarrow.parquet as pq

from attnscale.experiments import provenance_backfill as backfill
from attnscale.experiments import provenance_table, results_store


def _packed_argv(names, size=None):
  runs = [{"config": "c.py", "workdir": f"/w/runs/{n}"} for n in names]
  return (["/x/attnscale/runtime/packed.py", f"--runs={json.dumps(runs)}"]
          + ([f"--pack_size={size}"] if size else []))


def test_what_each_kind_of_record_shows():
  assert backfill.recover({"argv": _packed_argv(["a", "b", "c"])}, "b") == (3, 1)
  assert backfill.recover({"argv": _packed_argv(["a", "b"], size=4)}, "a") == (4, 0)
  assert backfill.recover({"argv": ["packed.py"], "pack": ["/r/a", "/r/b"]}, "b") == (2, 1)
  # The run is not in its pack's list (renamed since?): the size is known, the slot not.
  assert backfill.recover({"argv": _packed_argv(["a", "b"])}, "z") == (2, "unknown")
  assert backfill.recover({"argv": ["/x/train.py", "--config=c"]}, "a") == (1, 0)
  assert backfill.recover({"argv": ["sweep.py"]}, "a") == ("unknown", "unknown")


def test_a_store_gets_the_fields_and_keeps_everything_else(tmp_path):
  records = {
      "a": [{"commit": "c1", "argv": _packed_argv(["a", "b"])},
            {"commit": "c2", "argv": ["/x/train.py"]}],  # resumed alone
      "b": [{"commit": "c1", "argv": _packed_argv(["a", "b"])}],
      "new": [{"commit": "c3", "argv": ["train.py"], "pack_size": 8, "slot": 5}]}
  # A store's rows as `results_store.add` writes them (files as text columns).
  rows = [{"folder": "raw", "run": run, "label": "x", "seed": 0,
           "provenance.json": json.dumps(recs, indent=2), "config.json": '{"x": 1}',
           "gzipped": [], "other_files": []} for run, recs in records.items()]
  store = str(tmp_path / "runs.parquet")
  results_store._write(results_store._table(rows), store)  # noqa: SLF001
  before = pq.read_table(store)
  assert backfill.backfill(store) == 2
  assert backfill.backfill(store) == 0  # the second time: nothing to do, not rewritten
  after = pq.read_table(store)
  for name in before.column_names:
    if name != "provenance.json":
      assert before.column(name).equals(after.column(name)), name
  out = results_store.unpack(store, str(tmp_path / "back"))
  read = {os.path.basename(p): json.loads(open(os.path.join(p, "provenance.json")).read())
          for p in out}
  assert [(r["pack_size"], r["slot"]) for r in read["a"]] == [(2, 0), (1, 0)]
  assert read["a"][0]["recovered"] == ["pack_size", "slot"]
  assert read["new"] == records["new"]  # training wrote its fields: left as it is
  assert provenance_table.pack_size(read["b"][0]) == "2"
