"""FSDP: parameters and optimizer state sharded on the `fsdp` axis of a
`data` x `fsdp` mesh (`config.mesh`), on 8 fake CPU devices.

`--config.mesh.fsdp=8` trains like the default (all devices on `data`) within
1e-5 while each device holds an eighth of every matrix; checkpoints restore
across mesh shapes (bit for bit) and a run resumes on another mesh; a mesh that
does not fit the devices or the parameters fails at start with one line naming
the field, before the workdir is touched. The sharding rule and the mesh checks
are also tested here directly, without devices.

Needs $ATTNSCALE_DATA for the end-to-end test (CI sets it).
"""

import json
import os
import subprocess
import sys

import ml_collections
import pytest
from jax.sharding import PartitionSpec as P

from attnscale import testing
from attnscale.runtime import configlib
from attnscale.runtime import train_state as ts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_DEVICES = 8


# ---------------------------------------------------------------------------
# The rule and the checks, without devices.


@pytest.mark.parametrize("shape, fsdp, spec", [
    ((65, 32), 8, P(None, "fsdp")),  # the vocabulary does not split: the width does
    ((32, 128), 8, P(None, "fsdp")),  # the largest axis that splits
    ((128, 32), 8, P("fsdp")),
    ((32, 32), 8, P("fsdp")),  # equal axes: the first
    ((32,), 8, P()),  # vectors and scalars stay replicated
    ((), 8, P()),
    ((64, 64), 1, P()),  # fsdp 1: everything replicated
    ((36, 36), 8, None),  # no axis splits into 8
])
def test_fsdp_spec_splits_the_largest_divisible_axis(shape, fsdp, spec):
  assert ts.fsdp_spec(shape, fsdp) == spec


def mesh_config(data, fsdp):
  return ml_collections.ConfigDict({"mesh": {"data": data, "fsdp": fsdp}})


@pytest.mark.parametrize("data, fsdp, shape", [
    (-1, 1, (8, 1)), (-1, 8, (1, 8)), (2, -1, (2, 4)), (4, 2, (4, 2)), (1, 8, (1, 8)),
])
def test_mesh_shape(data, fsdp, shape):
  assert configlib.mesh_shape(mesh_config(data, fsdp), NUM_DEVICES) == shape


def test_mesh_shape_without_a_mesh_field_is_all_data():
  # A config.json written before config.mesh existed still evaluates and resumes.
  assert configlib.mesh_shape(ml_collections.ConfigDict({"seed": 0}), 8) == (8, 1)
  assert configlib.mesh_shape(None, 4) == (4, 1)


@pytest.mark.parametrize("data, fsdp, message", [
    (3, 2, "config.mesh.data x config.mesh.fsdp (3 x 2 = 6) must equal the device count (8)"),
    (-1, 3, "config.mesh.fsdp (3) must divide the device count (8)"),
    (5, -1, "config.mesh.data (5) must divide the device count (8)"),
    (-1, -1, "config.mesh.data and config.mesh.fsdp cannot both be -1"),
    (0, 8, "config.mesh.data must be a device count >= 1 or -1 (all the rest), got 0"),
    (-1, -2, "config.mesh.fsdp must be a device count >= 1 or -1 (all the rest), got -2"),
])
def test_bad_mesh_is_a_one_line_error_naming_the_field(data, fsdp, message):
  with pytest.raises(ValueError) as info:
    configlib.mesh_shape(mesh_config(data, fsdp), NUM_DEVICES)
  assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


# ---------------------------------------------------------------------------
# End to end, on 8 fake devices (a subprocess: the device count is fixed at
# JAX's start). One process does every run; the tests read its report.

_EIGHT_DEVICES = r"""
import json, os, shutil, sys
import jax, numpy as np
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import train_lib
from attnscale.runtime import train_state as ts
from configs import bert_small, shakespeare_char

data_dir, root = sys.argv[1], sys.argv[2]
assert jax.device_count() == 8, jax.devices()


def config(**overrides):
  c = shakespeare_char.get_config("preset=test")
  c.data_dir, c.log_every = data_dir, 1
  c.update_from_flattened_dict(overrides)
  return c


def run(name, **overrides):
  workdir = os.path.join(root, name)
  train_lib.train_and_evaluate(config(**overrides), workdir)
  return workdir


def restore(workdir, step, **overrides):
  c = config(**overrides)
  _, state, shardings = ts.create_state(c, ts.make_mesh(c))
  checkpoints = ckpt.Checkpoints(workdir, c.keep_checkpoints)
  try:
    return jax.tree.map(np.asarray, jax.device_get(checkpoints.restore(state, shardings, step)))
  finally:
    checkpoints.close()


def error(name, **overrides):
  try:
    run(name, **overrides)
  except ValueError as e:
    return str(e)


report = {}
run("data")
fsdp = run("fsdp", **{"mesh.fsdp": 8})

# What one device holds of each parameter and optimizer moment.
c = config(**{"mesh.fsdp": 8})
_, state, _ = ts.create_state(c, ts.make_mesh(c))
report["shards"] = {
    jax.tree_util.keystr(path): [list(x.shape), list(x.addressable_shards[0].data.shape)]
    for path, x in jax.tree_util.tree_leaves_with_path(state)}

# The fsdp run's last checkpoint, restored onto three meshes.
final = {mesh: restore(fsdp, 20, **overrides) for mesh, overrides in {
    "fsdp8": {"mesh.fsdp": 8}, "data8": {}, "data2_fsdp4": {"mesh.data": 2, "mesh.fsdp": 4},
}.items()}
report["restored_equal"] = {
    mesh: all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(final["fsdp8"]),
                                                   jax.tree.leaves(tree)))
    for mesh, tree in final.items()}

# The fsdp run resumed from step 10 on the default mesh.
resumed = os.path.join(root, "resumed")
shutil.copytree(fsdp, resumed)
shutil.rmtree(os.path.join(resumed, "checkpoints", "20"))
run("resumed")

# Other models' matrices all split at fsdp 8 (shapes only: nothing allocated).
mesh = ts.make_mesh(config(**{"mesh.fsdp": 8}))
unsplit = {}
for name, c in {"nanogpt": shakespeare_char.get_config("preset=nanogpt"),
                "unit_scaled": shakespeare_char.get_config("preset=cpu,scaling=unit_scaled"),
                "bert_small": bert_small.get_config("preset=cpu"),
                "bert_small_unit": bert_small.get_config("preset=cpu,scaling=unit_scaled")}.items():
  shapes = ts.state_shapes(c)
  shardings = ts.state_shardings(shapes, mesh)
  unsplit[name] = [jax.tree_util.keystr(path) for (path, x), s in zip(
      jax.tree_util.tree_leaves_with_path(shapes), jax.tree.leaves(shardings))
      if x.ndim >= 2 and "fsdp" not in s.spec]
report["unsplit_matrices"] = unsplit

report["errors"] = {
    "product": error("bad_product", **{"mesh.data": 3, "mesh.fsdp": 2}),
    "divide": error("bad_divide", **{"mesh.fsdp": 3}),
    "param": error("bad_param", **{"mesh.fsdp": 8, "model.width": 36}),
}
report["bad_workdirs"] = sorted(n for n in os.listdir(root) if n.startswith("bad_"))
print(json.dumps(report))
"""


def eight_devices_env(cache_dir):
  return testing.cpu_devices_env(NUM_DEVICES, JAX_COMPILATION_CACHE_DIR=str(cache_dir),
                                 JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


@pytest.fixture(scope="module")
def eight_devices(tfds_dir, tmp_path_factory):
  """(root, report, stdout) of the runs on 8 fake devices."""
  root = tmp_path_factory.mktemp("fsdp")
  proc = subprocess.run(
      [sys.executable, "-c", _EIGHT_DEVICES, tfds_dir, str(root)], cwd=ROOT,
      env=eight_devices_env(tmp_path_factory.mktemp("xla_cache_fsdp")),
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return root, json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_fsdp_8_trains_like_data_parallel(eight_devices):
  root, _, stdout = eight_devices
  assert "8 devices (cpu, fsdp 8)" in stdout
  data, fsdp = read_metrics(root / "data"), read_metrics(root / "fsdp")
  assert [sorted(m) for m in data] == [sorted(m) for m in fsdp]
  for m1, m8 in zip(data, fsdp):
    for key in ("train/loss", "train/grad_norm", "val/loss"):
      if key in m1:
        assert m8[key] == pytest.approx(m1[key], abs=1e-5), (m1["step"], key)


def test_each_device_holds_an_eighth_of_every_matrix(eight_devices):
  _, report, _ = eight_devices
  shards = report["shards"]
  for path, (shape, shard) in shards.items():
    if len(shape) >= 2:  # parameters and both Adam moments
      assert shard[0] * shard[1] * 8 == shape[0] * shape[1], (path, shape, shard)
    else:
      assert shard == shape, path  # vectors and scalars replicated
  embedding = [v for k, v in shards.items() if k.startswith("['params']['embed']")]
  assert embedding == [[[65, 32], [65, 4]]]  # 65 characters do not split: the width does
  assert all(not paths for paths in report["unsplit_matrices"].values()), (
      report["unsplit_matrices"])


def test_checkpoints_restore_across_mesh_shapes(eight_devices):
  root, report, stdout = eight_devices
  assert report["restored_equal"] == {"fsdp8": True, "data8": True, "data2_fsdp4": True}
  # Resumed on the default mesh from the fsdp run's step 10: the same run.
  assert f"resumed from {root / 'resumed'} at step 10" in stdout
  fsdp, resumed = read_metrics(root / "fsdp"), read_metrics(root / "resumed")
  assert [m["step"] for m in resumed] == [m["step"] for m in fsdp]
  for m1, m2 in zip(fsdp, resumed):
    for key in ("train/loss", "val/loss"):
      if key in m1:
        assert m2[key] == pytest.approx(m1[key], abs=1e-5), (m1["step"], key)


def test_bad_mesh_fails_at_start_naming_the_field(eight_devices):
  _, report, _ = eight_devices
  errors = report["errors"]
  assert errors["product"] == (
      "config.mesh.data x config.mesh.fsdp (3 x 2 = 6) must equal the device count (8); "
      "-1 in one of them takes all the rest")
  assert errors["divide"] == "config.mesh.fsdp (3) must divide the device count (8)"
  assert errors["param"] == (
      "config.mesh.fsdp=8 divides no axis of params.blocks.0.attn.k_proj.kernel (36, 36): "
      "with 8 devices it must be one of [1, 2, 4]")
  assert report["bad_workdirs"] == []  # nothing was created


def test_train_py_bad_mesh_exits_with_one_line_error(tmp_path):
  proc = subprocess.run(
      [sys.executable, "train.py", "--config=configs/shakespeare_char.py:preset=test",
       f"--workdir={tmp_path / 'run'}", "--config.mesh.fsdp=3"],
      cwd=ROOT, env=eight_devices_env(tmp_path / "cache"), capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == [
      "error: config.mesh.fsdp (3) must divide the device count (8)"]
  assert not (tmp_path / "run").exists()
