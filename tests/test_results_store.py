"""The results store gives back every run's files, an archive adds to it atomically,
and a figure saved twice has the same bytes (attnscale/experiments/results_store.py,
reporting/figures.py)."""

import gzip
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from attnscale.experiments import results_store, run_records
from attnscale.experiments.reporting import figures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPTH = os.path.join(ROOT, "docs", "results", "depth", "runs.parquet")

# Floats a metrics log may hold: float32 values, float64 ones, exponents, NaN,
# -0.0, a number Python would write otherwise ("1.50"), per-head lists, ints.
LINES = ('{"step": 0, "train/loss": 3.3172714710235596, "train/lr": 0.0001220703125, '
         '"train/elapsed_s": 19.655521337000003, "x": 1e-05, "y": -0.0, "z": NaN, '
         '"heads": [5.844968795776367, -7.7369771003723145], "n": 3}\n'
         '{"step": 20, "train/loss": 1.50, "w": 2.5E+3, "name": "layer_1.5"}\n'
         '{"step": 40, "max": 2.5, "mean": 2.0, "heads": [1.5, 2.5], "again": [3.5, 3.5]}\n'
         '{"step": 50, "steps_per_s": 59.53844680474551, "tokens_per_s": 60967.369528059404}\n'
         '{"step": 60, "train/lo')  # a torn last line


def _runs(tmp_path, names=("a", "b")):
  """Two archived runs (a committed depth run's config and provenance, unlabelled; a metrics
  log with every kind of float, a binary file) in tmp_path/raw/."""
  with open(DEPTH, "rb"):  # skip cleanly below when the store is absent
    pass
  first = results_store.runs_frame(DEPTH)["run"].iloc[0]
  source = results_store.unpack(DEPTH, str(tmp_path / "depth"), only=f"^{first}$")[0]
  folder = tmp_path / "raw"
  for i, name in enumerate(names):
    run = folder / name
    run.mkdir(parents=True)
    for record in ("config.json", "provenance.json", "archived.json"):
      (run / record).write_bytes(open(os.path.join(source, record), "rb").read())
    # As a sweep archived it before labels were declared (the store's label is backfilled).
    config = json.loads((run / "config.json").read_text())
    config.pop("label")
    (run / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    archived = json.loads((run / "archived.json").read_text())
    archived.pop("backfilled")
    (run / "archived.json").write_text(json.dumps(archived))
    (run / "metrics.jsonl.gz").write_bytes(gzip.compress(LINES.encode(), mtime=0))
    (run / "blob.bin").write_bytes(bytes([0xFF, 0x00, i]))
  return folder


def _files(folder):
  return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
          for d, _, files in os.walk(folder) for f in files}


@pytest.fixture
def runs(tmp_path):
  if not os.path.exists(DEPTH):
    pytest.skip("no docs/results/depth/runs.parquet in this checkout")
  return _runs(tmp_path)


def test_pack_then_unpack_gives_every_file_back(runs, tmp_path):
  store = str(tmp_path / "runs.parquet")
  assert results_store.pack(store, [str(runs)]) == 2
  results_store.unpack(store, str(tmp_path / "back"))
  expected = _files(runs)  # but the metrics logs' lists, thinned (the next test)
  for name in ("a", "b"):
    expected[f"{name}/metrics.jsonl.gz"] = gzip.compress(
        results_store.thin_lists(LINES).encode(), mtime=0)
  assert _files(tmp_path / "back") == expected  # gzip bytes too: level 9, no mtime
  frame = results_store.runs_frame(store)
  assert list(frame["run"]) == ["a", "b"] and set(frame["folder"]) == {"raw"}
  metrics = results_store.metrics_frame(store, metrics=["heads", "train/loss"], runs=["a"])
  heads = metrics[metrics["metric"] == "heads"]["value"].iloc[0]
  assert heads == [1.5, 2.5]  # a list stays a list (step 40's: the last line with lists)
  assert len(metrics) == 3  # the torn line skipped (step 50 has neither metric)


def test_a_store_keeps_lists_at_validation_steps_and_every_scalar():
  log = ('{"step": 0, "train/loss": 1.5, "h/layer_0": [1.0, 2.0], "n": 3}\n'
         '{"step": 10, "train/loss": 1.25, "h/layer_0": [1.0, 3.0]}\n'
         '{"step": 10, "val/loss": 2.0}\n'
         '{"step": 20, "train/loss": 1.0, "h/layer_0": [0.5, 3.0]}\n'
         '{"step": 30, "train/loss": 0.5, "h/layer_0": [0.5, 3.5]}\n'
         '{"step": 40, "tr')
  kept = results_store.thin_lists(log)
  assert kept.split("\n") == ['{"step": 0, "train/loss": 1.5, "n": 3}',
                               '{"step": 10, "train/loss": 1.25, "h/layer_0": [1.0, 3.0]}',
                               '{"step": 10, "val/loss": 2.0}',
                               '{"step": 20, "train/loss": 1.0}',
                               '{"step": 30, "train/loss": 0.5, "h/layer_0": [0.5, 3.5]}',
                               '{"step": 40, "tr']  # the torn line as it was
  assert results_store.thin_lists(kept) == kept


def test_thin_rewrites_a_store_packed_before_and_is_idempotent(runs, tmp_path, monkeypatch):
  store = str(tmp_path / "runs.parquet")
  monkeypatch.setattr(results_store, "thin_lists", lambda text: text)  # packed before
  results_store.pack(store, [str(runs)])
  monkeypatch.undo()
  assert results_store.thin(store) == 2 and results_store.thin(store) == 0
  back = results_store.unpack(store, str(tmp_path / "back"))[0]
  with gzip.open(os.path.join(back, "metrics.jsonl.gz"), "rt") as f:
    assert f.read() == results_store.thin_lists(LINES)


def test_floats_a_line_repeats_or_averages_are_stored_once():
  template, f32, f64 = results_store._encode(LINES)
  # max: the same as a later head (a mark and its distance); mean: the float32 mean
  # of the list after it; tokens_per_s: steps_per_s x 2^10; all left out of the floats.
  assert '"max": \x02' in template and '"mean": \x03\ue000' in template
  assert '"tokens_per_s": \x04' in template and 60967.369528059404 not in f64
  assert f32.count(2.5) == f32.count(3.5) == 1 and 2.0 not in f32
  assert '"train/loss": 1.50' in template and "NaN" in template  # kept as written
  assert results_store._decode(template, f32, f64) == LINES
  assert results_store._encode("a\x02b") is None  # a mark in the text: stored as text


def test_a_reader_reads_a_store_as_the_folder(runs, tmp_path):
  store = str(tmp_path / "runs.parquet")
  results_store.pack(store, [str(runs)])
  folder = results_store.workdir(store)
  assert results_store.shown(folder) == store
  assert sorted(os.listdir(folder)) == ["a", "b"]
  assert run_records.status(os.path.join(folder, "a"), read_checkpoint=False) == "done"
  assert results_store.run_dirs([folder]) == [os.path.join(folder, n) for n in ("a", "b")]
  assert results_store.workdir(f"{store}/raw") == folder
  with pytest.raises(ValueError, match="no folder 'raw_cpu'"):
    results_store.workdir(f"{store}/raw_cpu")


def test_archive_to_a_store_adds_and_replaces_atomically(runs, tmp_path, monkeypatch):
  store = str(tmp_path / "results" / "runs.parquet")
  assert results_store.archive(str(runs), store, ["a"]) == ["a"]
  assert results_store.archive(str(runs), store) == ["a", "b"]  # a replaced, b added
  assert list(results_store.runs_frame(store)["run"]) == ["a", "b"]
  # A run archived again with other records replaces its row.
  with open(runs / "b" / "archived.json") as f:
    archived = json.load(f)
  (runs / "b" / "eval.json").write_text('{"step": 1}')
  results_store.archive(str(runs), store, ["b"])
  rows = pq.read_table(store).to_pylist()
  assert [r["eval.json"] for r in rows] == [None, '{"step": 1}']
  assert json.loads(rows[1]["archived.json"]) == archived
  # A write that fails leaves the committed store as it was, and no temporary file.
  before = open(store, "rb").read()

  def broken(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr(pq, "write_table", broken)
  with pytest.raises(OSError, match="disk full"):
    results_store.archive(str(runs), store, ["a"])
  assert open(store, "rb").read() == before
  assert os.listdir(os.path.dirname(store)) == ["runs.parquet"]


def test_the_archive_command_adds_a_workdirs_records_not_its_weights(runs, tmp_path, capsys):
  (runs / "a" / "checkpoints" / "1500").mkdir(parents=True)  # weights stay behind
  (runs / "a" / "checkpoints" / "1500" / "params").write_bytes(b"weights")
  store = str(tmp_path / "hunt.parquet")
  results_store.main(["archive", str(runs), store])
  assert "archived 2 finished runs" in capsys.readouterr().out
  assert list(results_store.runs_frame(store)["run"]) == ["a", "b"]
  back = tmp_path / "back"
  results_store.unpack(store, str(back))
  assert not (back / "a" / "checkpoints").exists()
  with pytest.raises(SystemExit):
    results_store.main(["archive", str(runs), str(tmp_path / "hunt.csv")])
  assert "must end in .parquet" in capsys.readouterr().err


def test_a_store_path_names_a_folder_or_is_refused(tmp_path):
  assert results_store.split("docs/results/x/runs.parquet/raw_cpu") == (
      "docs/results/x/runs.parquet", "raw_cpu")
  assert results_store.split("runs/transfer") == (None, None)
  with pytest.raises(ValueError, match="one folder"):
    results_store.split("a/runs.parquet/raw/run")


def test_a_figure_saved_twice_has_the_same_bytes(tmp_path):
  def draw():
    fig = figures.new_figure(3, 2)
    ax = fig.subplots()
    ax.plot(np.arange(5), np.arange(5) ** 2, **figures.style(0), label="a")
    figures.label_axes(ax, xlabel="x", ylabel="y", title="t")
    return fig

  one = figures.save_figure(draw(), str(tmp_path / "1"), "f")
  two = figures.save_figure(draw(), str(tmp_path / "2"), "f")
  data = open(one, "rb").read()
  assert data == open(two, "rb").read()
  assert b"tEXt" not in data and b"tIME" not in data and b"iTXt" not in data


def test_labels_are_declared_after_the_fact_and_kept_where_declared(runs, tmp_path, capsys):
  """`set_labels` writes config.label into runs that have none (and says so in
  archived.json), leaves a run that has one as it is, and changes nothing else."""
  store = str(tmp_path / "runs.parquet")
  config = json.loads((runs / "b" / "config.json").read_text())
  (runs / "b" / "config.json").write_text(json.dumps(config | {"label": "mine"}, indent=2,
                                                     sort_keys=True))
  results_store.pack(store, [str(runs)])
  results_store.unpack(store, str(tmp_path / "before"))
  before = _files(tmp_path / "before")
  assert results_store.set_labels(store, {"a": "softmax", "b": "other"}, "by hand") == 1
  results_store.unpack(store, str(tmp_path / "back"))
  after = _files(tmp_path / "back")
  assert json.loads(after["a/config.json"]) == config | {"label": "softmax"}
  assert json.loads(after["a/archived.json"])["backfilled"] == {"label": "by hand"}
  assert json.loads(after["b/config.json"])["label"] == "mine"
  assert {k for k in after if after[k] != before[k]} == {"a/config.json", "a/archived.json"}
  assert list(results_store.runs_frame(store)["label"]) == ["softmax", "mine"]
