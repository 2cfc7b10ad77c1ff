"""Going on from a finished run, from the command line: raising num_train_steps
continues a run under a constant learning rate (and is refused in one line, saying
why, under a decaying one); --config.init_from=WORKDIR starts a new run from another
run's parameters (optimizer state fresh, the source in provenance.json), saying in
one line what differs, and a run whose parameters do not match in one line naming
them.

Needs $ATTNSCALE_DATA (CI sets it).
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from attnscale import testing
from attnscale.runtime import rundir
from attnscale.runtime import train_state as ts
from configs import shakespeare_char


def train_py(workdir, data_dir, *flags):
  return subprocess.run(
      [sys.executable, "train.py", "--config=configs/shakespeare_char.py:preset=test",
       f"--workdir={workdir}", f"--config.data_dir={data_dir}", "--config.log_every=1", *flags],
      cwd=testing.ROOT, capture_output=True, text=True, timeout=300,
      env=testing.subprocess_env(JAX_PLATFORMS="cpu"))


def steps_logged(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return sorted({json.loads(line)["step"] for line in f})


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A finished 3-step run with rotary positions (no table as long as the context)."""
  return testing.train_tiny_run(tmp_path_factory, steps=3, name="source",
                                overrides={"model.positions": "rope"})


def test_a_constant_run_continues_to_more_steps(tfds_dir, tmp_path):
  workdir = tmp_path / "run"
  first = train_py(workdir, tfds_dir, "--config.lr_schedule=constant",
                   "--config.num_train_steps=3")
  assert first.returncode == 0, first.stderr[-3000:]
  more = train_py(workdir, tfds_dir, "--config.lr_schedule=constant",
                  "--config.num_train_steps=5")
  assert more.returncode == 0, more.stderr[-3000:]
  assert f"resumed from {workdir} at step 3" in more.stdout, more.stdout
  assert steps_logged(workdir) == [1, 2, 3, 4, 5]
  assert "done: 5 steps, " in more.stdout


def test_a_decaying_run_refuses_to_continue_in_one_line_saying_why(source, tmp_path):
  before = testing.snapshot(source.workdir)
  proc = train_py(source.workdir, source.config.data_dir, "--config.model.positions=rope",
                  "--config.num_train_steps=6")
  line = testing.assert_one_line_error(proc, "num_train_steps 3 -> 6", "lr_schedule='cosine'",
                                       "--config.lr_schedule=constant",
                                       f"--config.init_from={source.workdir}")
  assert "decay" in line
  assert testing.snapshot(source.workdir) == before


def test_init_from_starts_a_longer_run_from_the_parameters(source, tmp_path):
  """Trained at 32 with RoPE, fine-tuned at 64: one line names what differs; the
  provenance records the source; the run is a new one (its own 2 steps)."""
  workdir = tmp_path / "longer"
  proc = train_py(workdir, source.config.data_dir, "--config.model.positions=rope",
                  f"--config.init_from={source.workdir}", "--config.model.block_size=64",
                  "--config.seq_len=64", "--config.num_train_steps=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (f"started from the parameters of {source.workdir} at step 3 (optimizer state fresh); "
          "differs in model.block_size 32 -> 64, seq_len 32 -> 64\n") in proc.stdout, proc.stdout
  with open(workdir / "provenance.json") as f:
    record = json.load(f)[-1]["init_from"]
  assert record == {"workdir": source.workdir, "step": 3,
                    "differs": ["model.block_size 32 -> 64", "seq_len 32 -> 64"]}
  assert steps_logged(workdir) == [1, 2]
  # The rerun resumes the new run's own checkpoint, saying nothing of the source.
  again = train_py(workdir, source.config.data_dir, "--config.model.positions=rope",
                   f"--config.init_from={source.workdir}", "--config.model.block_size=64",
                   "--config.seq_len=64", "--config.num_train_steps=2")
  assert again.returncode == 0 and "started from" not in again.stdout, again.stdout


def test_start_from_reads_the_parameters_and_leaves_the_optimizer_fresh(source, tmp_path):
  config = shakespeare_char.get_config("preset=test")
  config.update_from_flattened_dict({"model.positions": "rope", "learning_rate": 1e-4})
  _, fresh, shardings = ts.create_state(config, ts.make_mesh(config))
  state, _ = rundir.start_from(source.workdir, config, fresh, shardings, str(tmp_path / "new"))
  saved = testing.restore_checkpoint(source.config, source.workdir)
  for got, want in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(saved["params"])):
    np.testing.assert_array_equal(np.asarray(got), want)
  for got, want in zip(jax.tree.leaves(state["opt_state"]), jax.tree.leaves(fresh["opt_state"])):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert int(state["step"]) == 0


@pytest.mark.parametrize("flags, names", [
    (["--config.model.block_size=64", "--config.seq_len=64"],  # a learned table of 64
     ["pos_embed (not in", "config.init_from="]),
    (["--config.model.positions=rope", "--config.model.width=64"],
     ["embed/embedding (65, 32) -> (65, 64)", "model.width 32 -> 64"]),
], ids=["positions", "width"])
def test_init_from_parameters_that_differ_is_one_line_naming_them(source, tmp_path, flags,
                                                                   names):
  fresh = tmp_path / "fresh"
  proc = train_py(fresh, source.config.data_dir, f"--config.init_from={source.workdir}", *flags)
  testing.assert_one_line_error(proc, "the parameters differ in shape", *names)
  assert not fresh.exists()


def test_init_from_a_folder_that_is_not_a_run(tfds_dir, tmp_path):
  proc = train_py(tmp_path / "fresh", tfds_dir, f"--config.init_from={tmp_path / 'nosuch'}")
  testing.assert_one_line_error(proc, f"config.init_from={tmp_path / 'nosuch'}", "does not exist")


def test_a_packed_sweep_refuses_init_from_in_one_line(tmp_path):
  from attnscale.runtime import packed
  config = shakespeare_char.get_config("preset=test")
  config.init_from = str(tmp_path / "source")
  with pytest.raises(ValueError, match=r"^config.init_from starts one run .*without --pack$"):
    packed.train_packed([config], [str(tmp_path / "run")])
  assert not (tmp_path / "run").exists()
