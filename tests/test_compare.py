"""compare.py / attnscale-compare: runs side by side from their metrics.jsonl, from the
command line: the PNG of their curves (attention health with --attention_layer), the
table of final numbers, labels from the runs' configs, a sweep folder as its runs,
and one-line errors."""

import os
import struct
import subprocess
import sys

import pytest

from attnscale import testing


def compare(*args, cwd=testing.ROOT):
  return subprocess.run([sys.executable, os.path.join(testing.ROOT, "compare.py"), *args],
                        cwd=cwd, capture_output=True, text=True, timeout=120,
                        env=testing.subprocess_env(JAX_PLATFORMS="cpu"))


def png_size(path) -> tuple[int, int]:
  with open(path, "rb") as f:
    head = f.read(24)
  assert head[:8] == b"\x89PNG\r\n\x1a\n", head
  return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny run as train.py leaves it (attention metrics on, a row every step)."""
  return testing.train_tiny_run(tmp_path_factory, steps=4, name="trained",
                                overrides={"log_every": 1, "eval_every": 2})


def rows(steps, loss, val_every=2):
  out = []
  for step in range(1, steps + 1):
    row = {"step": step, "train/loss": loss - 0.1 * step, "train/loss_last20": loss - 0.05 * step,
           "train/elapsed_s": float(step), "train/attn/max_logit/layer_0": 1.0 + step,
           "train/attn/entropy/layer_0": 2.0 - 0.1 * step}
    out.append(row)
    if step % val_every == 0:
      out.append({"step": step, "val/loss": loss - 0.08 * step})
  return out


def test_two_runs_and_a_sweep_folder(trained, tmp_path):
  """A trained run and a sweep folder of two runs that share a label: four rows in
  the table, labels from the configs (the sweep's told apart by the field in which
  they differ), the figure written, with the attention panels on request."""
  sweep = tmp_path / "sweep"
  for lr in (1e-3, 2e-3):
    testing.fake_run(sweep, f"cosine-lr{lr:g}", "preset=test,scaling=cosine",
                     {"learning_rate": lr, "num_train_steps": 4}, rows(4, 3.0 + lr * 100))
  out = tmp_path / "figs" / "runs.png"
  proc = compare(trained.workdir, str(sweep), f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert lines[0].startswith("| run | label | step | final train loss |"), lines
  assert lines[-1] == f"wrote {out}"
  body = lines[2:-1]
  assert len(body) == 3, body
  assert body[0].startswith(f"| {trained.workdir} | standard | 4/4 | "), body[0]
  assert f"| {sweep}/cosine-lr0.001 | cosine (learning_rate=0.001) | 4/4 | 2.9000 | " in body[1]
  assert f"| {sweep}/cosine-lr0.002 | cosine (learning_rate=0.002) | 4/4 |" in body[2]
  width, height = png_size(out)
  assert width > 1000 and height > 400, (width, height)

  with_attention = tmp_path / "attention.png"
  proc = compare(trained.workdir, str(sweep), f"--out={with_attention}", "--attention_layer=-1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert png_size(with_attention)[1] > 1.6 * height  # two more panels below


@pytest.mark.parametrize("args, names", [
    (["nosuch"], ["nosuch does not exist"]),
    (["--out=x.pdf", "."], ["--out=x.pdf", ".png"]),
    ([], ["give the run directories"]),
])
def test_bad_input_is_one_line(tmp_path, args, names):
  empty = tmp_path / "empty"
  empty.mkdir()
  proc = compare(*args, cwd=tmp_path)
  testing.assert_one_line_error(proc, *names)


def test_a_folder_without_runs_is_one_line(tmp_path):
  (tmp_path / "empty").mkdir()
  proc = compare("empty", cwd=tmp_path)
  testing.assert_one_line_error(proc, "empty is neither a run directory")
