"""Every registered sweep yields the same points, in the same order, as the snapshot.

tests/data/sweep_points.json was written from configs/sweeps.py before it was split
into configs/<config>_sweeps.py, so a refactor of the sweep files that changes any
study's runs (a point, its order, its name, a default pack) fails here. Staged sweeps
are read twice: with nothing run (stage 1's points, kept in full), and against a
made-up workdir where every run has finished with a loss that is a smooth bowl in
log2(lr) plus noise from the run's name, so the search goes through its later stages
(transfer, bands, windows); those lists are kept as a count and a SHA-256.

Regenerate (only when a sweep is meant to change): python tests/test_sweep_points.py
"""

import hashlib
import json
import math
import os
import re
import sys
import zlib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from attnscale.experiments import run_records, sweeps  # noqa: E402

SNAPSHOT = os.path.join(ROOT, "tests", "data", "sweep_points.json")
CONFIGS = ("configs/shakespeare_char.py", "configs/bert_small.py", "configs/gpt2.py")
FAKE_WORKDIR = "/nonexistent-sweep-points-workdir"
_LR = r"-lr(\d+(?:\.\d+)?(?:e-\d+)?)"  # a point name's learning rate, as Point.name writes it


def _fake_read_run(run_dir: str) -> dict:
  """A finished run whose loss is a bowl in log2(lr) with its centre and noise set by
  the run's name (deterministic: crc32), diverged above 2^-2."""
  name = os.path.basename(run_dir)
  lr = float(re.search(_LR, name).group(1))
  if lr > 2.0**-2:
    return {"status": "diverged", "final_train_loss": math.nan}
  key = re.sub(_LR, "", name)
  no_seed = re.sub(r"-\d+(?=-|$)", "", key, count=1)
  centre = 4 + zlib.crc32(no_seed.encode()) % 8
  noise = (zlib.crc32(name.encode()) % 1000) / 1000 * 0.02
  return {"status": "done", "final_train_loss": 2 + 0.01 * (math.log2(lr) + centre)**2 + noise}


def _points(config: str, name: str, workdir: str | None) -> list:
  return [[p.name, p.arg, [[k, v] for k, v in p.overrides], list(p.eval_flags)]
          for p in sweeps.load_sweep(os.path.join(ROOT, config), name, workdir=workdir)]


def _digest(points: list) -> str:
  return hashlib.sha256(json.dumps(points, sort_keys=True).encode()).hexdigest()


def dump(monkeypatch) -> dict:
  """config -> sweep name -> {"pack", "points", "run": {"count", "sha256"}}."""
  monkeypatch.setattr(run_records, "read_run", _fake_read_run)
  out = {}
  for config in CONFIGS:
    path = os.path.join(ROOT, config)
    out[config] = {}
    for name in sweeps.sweep_names(path):
      ran = _points(config, name, FAKE_WORKDIR)
      out[config][name] = {"pack": sweeps.default_pack(path, name),
                           "points": _points(config, name, None),
                           "run": {"count": len(ran), "sha256": _digest(ran)}}
  return out


def test_every_sweep_yields_the_snapshot_points(monkeypatch):
  with open(SNAPSHOT) as f:
    want = json.load(f)
  got = json.loads(json.dumps(dump(monkeypatch)))  # tuples -> lists, as the file has
  assert list(got) == list(want)
  for config in want:
    assert list(got[config]) == list(want[config]), config
    for name in want[config]:
      assert got[config][name] == want[config][name], f"{config} sweep {name!r} changed"


if __name__ == "__main__":
  with pytest.MonkeyPatch.context() as mp:
    snapshot = dump(mp)
  with open(SNAPSHOT, "w") as f:
    json.dump(snapshot, f, separators=(",", ":"))
    f.write("\n")
  print(f"wrote {SNAPSHOT}: {os.path.getsize(SNAPSHOT)} bytes")
