"""What a result came from: provenance.json (attnscale/runtime/provenance.py), the
commit and largest logit `run_records.read_run` reads, runs.csv and the mixed-commit check."""

import csv
import json
import math
import os
import shutil
import subprocess

import jax
import pytest

from attnscale.experiments import sweep_results, sweeps
from attnscale.runtime import provenance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = {"commit", "dirty", "dirty_paths", "jax", "jaxlib", "python", "device_kind", "device_count",
        "process_count", "backend", "platform", "cpu", "cpu_isa", "argv", "hostname",
        "time_utc", "code"}
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo, *args):
  return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                        check=True, capture_output=True, text=True).stdout.strip()


@needs_git
def test_git_state_commit_and_dirty(tmp_path):
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  (repo / "code.py").write_text("x = 1\n")
  _git(repo, "add", "code.py")
  _git(repo, "commit", "-qm", "first")
  head = _git(repo, "rev-parse", "HEAD")
  tracked = str(repo / "code.py")
  assert provenance.git_state(str(repo), tracked) == (head, False)
  (repo / "runs" / "sweep").mkdir(parents=True)  # run directories are not code
  (repo / "runs" / "sweep" / "metrics.jsonl").write_text("{}\n")
  assert provenance.git_state(str(repo), tracked) == (head, False)
  # Neither are pages nor archived results, added or moved aside.
  (repo / "docs" / "results" / "study").mkdir(parents=True)
  (repo / "docs" / "results" / "study" / "runs.csv").write_text("label\n")
  (repo / "NOTES.md").write_text("")
  assert provenance.git_state(str(repo), tracked) == (head, False)
  assert provenance.dirty_paths(str(repo), tracked) == (head, [])
  (repo / "new.py").write_text("")  # an untracked module could be imported
  assert provenance.git_state(str(repo), tracked) == (head, True)
  assert provenance.dirty_paths(str(repo), tracked) == (head, ["new.py"])
  (repo / "new.py").unlink()
  (repo / "code.py").write_text("x = 2\n")
  assert provenance.git_state(str(repo), tracked) == (head, True)
  # A checkout that does not hold the code that runs (a venv inside another repo).
  assert provenance.git_state(str(repo), str(repo / "elsewhere.py")) == ("unknown", None)


def test_git_state_without_git_or_a_checkout(tmp_path, monkeypatch):
  assert provenance.git_state(str(tmp_path)) == ("unknown", None)  # not a checkout
  monkeypatch.setenv("PATH", str(tmp_path))  # no git on PATH
  assert provenance.git_state() == ("unknown", None)


def test_write_appends_a_record_per_start_and_read_returns_them(tmp_path, monkeypatch):
  monkeypatch.setattr("sys.argv", ["train.py", "--workdir=x"])
  first = provenance.write(str(tmp_path))
  second = provenance.write(str(tmp_path))  # a resume
  records = provenance.read(str(tmp_path))
  assert records == [first, second] and set(first) == KEYS
  assert first["argv"] == ["train.py", "--workdir=x"] and first["jax"] == jax.__version__
  assert first["device_count"] == jax.device_count() and first["time_utc"].endswith("Z")
  assert os.listdir(tmp_path) == ["provenance.json"]  # no temporary file left
  assert provenance.read(str(tmp_path / "missing")) == []


@needs_git
def test_write_records_this_checkouts_commit(tmp_path):
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
  tracked = subprocess.run(["git", "ls-files", "--error-unmatch", provenance.__file__],
                           cwd=ROOT, capture_output=True)
  if head.returncode or tracked.returncode:
    pytest.skip("not run from a git checkout of attnscale")
  entry = provenance.write(str(tmp_path))
  assert entry["commit"] == head.stdout.strip() and isinstance(entry["dirty"], bool)
  assert entry["dirty"] == bool(entry["dirty_paths"])  # the paths that make it dirty


def test_only_process_0_writes_and_an_unreadable_file_is_kept(tmp_path, monkeypatch):
  (tmp_path / "provenance.json").write_text("{not json")
  provenance.write(str(tmp_path))
  assert (tmp_path / "provenance.json.unreadable").read_text() == "{not json"
  assert len(provenance.read(str(tmp_path))) == 1
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  assert provenance.write(str(tmp_path / "other")) is None
  assert not (tmp_path / "other").exists()


def _records(run, records):
  with open(os.path.join(run, provenance.FILE), "w") as f:
    json.dump(records, f)


def test_commit_of_a_run(tmp_path):
  assert provenance.commit_of(str(tmp_path)) == "unknown"
  _records(tmp_path, [{"commit": "a" * 40, "dirty": False}])
  assert provenance.commit_of(str(tmp_path)) == "a" * 40
  # Resumed from other code, with uncommitted changes: both, and dirty.
  _records(tmp_path, [{"commit": "a" * 40, "dirty": False}, {"commit": "b" * 40, "dirty": True}])
  assert provenance.commit_of(str(tmp_path)) == "a" * 40 + "+" + "b" * 40 + "+dirty"


def _run(root, name, *, lr, seed=0, records, commit=None):
  run = os.path.join(root, name)
  os.makedirs(os.path.join(run, "checkpoints", "20"))
  with open(os.path.join(run, "config.json"), "w") as f:
    json.dump({"learning_rate": lr, "seed": seed, "num_train_steps": 20,
               "model": {"scaling": "standard", "variant": "standard"}}, f)
  with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  if commit:
    _records(run, [{"commit": commit, "dirty": False}])
  return run


def test_read_run_has_the_commit_and_the_last_max_logit(tmp_path):
  logged = {"train/loss": 2.0, "train/loss_last20": 2.0, "train/elapsed_s": 1.0}
  _run(tmp_path, "a", lr=0.01, commit="c" * 40, records=[
      {"step": 10, **logged, "train/attn/max_logit/layer_0": 9.0,
       "train/attn/max_logit/layer_1": 30.0},
      {"step": 20, **logged, "train/attn/max_logit/layer_0": 12.0,
       "train/attn/max_logit/layer_1": 11.0},
      {"step": 20, **logged}])  # a row without attention metrics (SIGTERM's)
  _run(tmp_path, "b", lr=0.02, records=[{"step": 20, **logged}])
  rows = {r["run"]: r for r in sweeps.collect(str(tmp_path))}
  assert rows["a"]["max_logit"] == 12.0 and rows["a"]["commit"] == "c" * 40
  assert math.isnan(rows["b"]["max_logit"]) and rows["b"]["commit"] == "unknown"


def test_runs_csv_has_a_line_per_run_with_its_hyperparameters(tmp_path):
  rows = [{"scaling": "standard", "variant": "standard", "label": "sp/standard", "width": w,
           "learning_rate": 2.0**-9, "seed": s, "steps": 20, "final_train_loss": 2.0 + w / 1e3,
           "best_val_loss": 2.1, "wall_s": 3.0, "status": "done", "run": f"r{w}-{s}",
           "curve": [(1, 3.0)], "max_logit": 12.5 if s == 0 else math.nan, "commit": "c" * 40,
           "host": "AMD EPYC/avx2"}
          for w in (32, 64) for s in (0, 1)]
  path = str(tmp_path / "out" / "runs.csv")
  columns = sweep_results.write_runs_csv(rows, path)
  assert columns == ["label", "learning_rate", "variant", "width", "seed", "final_train_loss",
                     "best_val_loss", "max_logit", "steps", "status", "commit", "host",
                     "run"]
  with open(path) as f:
    lines = list(csv.DictReader(f))
  assert len(lines) == 4 and list(lines[0]) == columns
  assert lines[1] == {"label": "sp/standard", "learning_rate": repr(2.0**-9),
                      "variant": "standard", "width": "32", "seed": "1",
                      "final_train_loss": repr(2.032), "best_val_loss": "2.1",
                      "max_logit": "nan", "steps": "20", "status": "done", "commit": "c" * 40,
                      "host": "AMD EPYC/avx2", "run": "r32-1"}
  assert float(lines[2]["final_train_loss"]) == rows[2]["final_train_loss"]  # exact
  # Rows without a label or provenance (sweeps.collect's placeholders): empty cells.
  sweep_results.write_runs_csv([{"scaling": "standard", "status": "new", "run": "x"}], path)
  with open(path) as f:
    assert next(csv.DictReader(f))["commit"] == ""


def test_commit_note_refuses_mixed_commits_unless_allowed():
  rows = ([{"commit": "a" * 40, "status": "done"}] * 2 + [{"commit": "b" * 40, "status": "done"}]
          + [{"status": "new"}])
  assert sweep_results.commit_note(rows[:2]) == f"runs from 1 commit: {'a' * 7} (2 runs)"
  with pytest.raises(ValueError, match=r"^runs from 2 commits: aaaaaaa \(2 runs\), bbbbbbb "
                                       r"\(1 run\); rerun them at one commit"):
    sweep_results.commit_note(rows)
  assert sweep_results.commit_note(rows, allow_mixed=True) == (
      "runs from 2 commits: aaaaaaa (2 runs), bbbbbbb (1 run)")
  dirty = [{"commit": "a" * 40 + "+dirty", "status": "done"}, {"commit": "unknown",
                                                                "status": "diverged"}]
  assert sweep_results.commit_note(dirty, allow_mixed=True) == (
      "runs from 2 commits: aaaaaaa+dirty (1 run), unknown (1 run)")


def test_write_results_writes_runs_csv_and_the_commit_note(tmp_path):
  rows = [{"scaling": "standard", "variant": "standard", "learning_rate": 2.0**-9, "seed": s,
           "steps": 20, "final_train_loss": 2.0 + s / 100, "best_val_loss": 2.1, "wall_s": 1.0,
           "status": "done", "run": f"r{s}", "curve": [(1, 3.0), (20, 2.0)],
           "max_logit": 10.0, "commit": c}
          for s, c in enumerate(["a" * 40, "a" * 40, "b" * 40])]
  paths = sweep_results.write_results(rows, str(tmp_path))
  assert os.path.getsize(paths["runs.csv"]) > 0
  assert "runs from 2 commits: aaaaaaa (2 runs), bbbbbbb (1 run)" in open(
      paths["results.md"]).read()


def test_host_cpu_reads_the_model_and_widest_vector_extension(tmp_path, monkeypatch):
  import builtins
  info = tmp_path / "cpuinfo"
  info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx avx2 fma\n"
                  "processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx avx2 fma\n")
  real_open = builtins.open
  monkeypatch.setattr(builtins, "open", lambda path, *a, **k: real_open(
      info if path == "/proc/cpuinfo" else path, *a, **k))
  assert provenance.host_cpu() == ("AMD EPYC", "avx2")
  info.write_text("model name : Intel Xeon\nflags : avx avx2 avx512f\n")
  assert provenance.host_cpu() == ("Intel Xeon", "avx512f")


def test_host_of_names_each_segments_machine(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  assert provenance.host_of(str(run)) == "unrecorded"  # no provenance.json
  records = [{"backend": "cpu"},  # a record from before the cpu fields
             {"backend": "cpu", "cpu": "AMD EPYC", "cpu_isa": "avx2"},
             {"backend": "gpu", "device_kind": "NVIDIA H100 80GB HBM3"}]
  (run / "provenance.json").write_text(json.dumps(records))
  assert provenance.host_of(str(run)) == "unrecorded+AMD EPYC/avx2+NVIDIA H100 80GB HBM3"
  rows = [{"commit": "a" * 40, "host": "AMD EPYC/avx2"}] * 2 + [
      {"commit": "a" * 40, "host": "Intel Xeon/avx512f"}]
  assert sweep_results.commit_note(rows[:2]).endswith("; hosts: AMD EPYC/avx2 (2 runs)")
  assert sweep_results.commit_note(rows).endswith(
      "; hosts: AMD EPYC/avx2 (2 runs), Intel Xeon/avx512f (1 run)")
