"""The shared_kv study on three tiny runs: separate, shared and the parameter-matched control."""

import argparse
import os

import pytest

from attnscale.runtime import train_lib
from attnscale.studies import shared_kv


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
  if not os.environ.get("ATTNSCALE_DATA"):
    pytest.skip("needs ATTNSCALE_DATA (CI sets it)")
  from configs import shakespeare_char
  workdir = tmp_path_factory.mktemp("sweep")
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  for name, overrides in {"separate": {}, "shared": {"model.shared_kv": True},
                          "control": {"model.num_kv_heads": 1}}.items():
    config = shakespeare_char.get_config("preset=test")
    config.data_dir, config.num_train_steps = data_dir, 10
    config.update_from_flattened_dict(overrides)
    train_lib.train_and_evaluate(config, str(workdir / name))
  return workdir


@pytest.mark.slow
def test_table_diagnostics_and_parameter_counts(sweep_dir, tmp_path):
  args = argparse.Namespace(workdirs=[str(sweep_dir)], out=str(tmp_path), weights=None,
                            no_diagnostics=False)
  paths, _ = shared_kv.run_cli(args)
  assert {os.path.basename(p) for p in paths} >= {"shared_kv.md", "shared_kv_diag.md",
                                                   "shared_kv.png"}
  rows = {r["label"]: r for r in shared_kv.comparison_rows(
      [r for r in shared_kv.sweeps.collect(str(sweep_dir))], str(sweep_dir))}
  assert list(rows) == ["standard", "standard+kv_heads1", "standard+shared_kv"]
  # Shared K/V drops one D x D projection per layer (test preset: 2 layers of width
  # 32); grouped-query attention with 1 of 2 key/value heads drops the same.
  separate = rows["standard"]["params"]
  assert separate - rows["standard+shared_kv"]["params"] == 2 * 32 * 32
  assert rows["standard+kv_heads1"]["params"] == rows["standard+shared_kv"]["params"]
  assert rows["standard"]["verdict"] == "baseline"
  diag = {r["label"]: r for r in shared_kv.diagnostic_rows(
      shared_kv.sweeps.collect(str(sweep_dir)), str(sweep_dir))}
  assert set(diag) == set(rows)
  assert all(0 < d["self_weight"] < 1 and -1 <= d["corr_qv"] <= 1 for d in diag.values())


@pytest.mark.slow
def test_an_archive_reads_its_weights_from_elsewhere(sweep_dir, tmp_path):
  """From a committed archive (records, no weights) the diagnostics need the best
  runs' weights from another directory (sweep.py --retrain_best_to): --weights."""
  from attnscale.experiments import run_records
  raw = tmp_path / "raw"
  run_records.archive(str(sweep_dir), str(raw))
  rows = shared_kv.sweeps.collect(str(raw))
  with pytest.raises(SystemExit, match="--retrain_best_to=DIR and give --weights DIR"):
    shared_kv.diagnostic_rows(rows, str(raw))
  diag = shared_kv.diagnostic_rows(rows, str(raw), weights=str(sweep_dir))
  again = shared_kv.diagnostic_rows(shared_kv.sweeps.collect(str(sweep_dir)), str(sweep_dir))
  assert diag == again
  # --no_diagnostics: the tables from the records alone, the same as with the weights.
  args = argparse.Namespace(workdirs=[str(raw)], out=str(tmp_path / "records"), weights=None,
                            no_diagnostics=True)
  paths, _ = shared_kv.run_cli(args)
  names = {os.path.basename(p) for p in paths}
  assert "shared_kv.md" in names and not names & {"shared_kv_diag.md", "shared_kv.png"}
