"""Tiny Shakespeare pipeline: TFDS builder without TensorFlow, batches, eval.

The tests that read the corpus need $ATTNSCALE_DATA (CI sets it) pointing at a
folder holding tinyshakespeare/input.txt; none touches the network.
"""

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from attnscale import data
from attnscale.data import paths, tiny_shakespeare
from attnscale.testing import serve_directory

REPO = pathlib.Path(__file__).resolve().parents[1]
RELPATH = tiny_shakespeare.TinyShakespeareChar.RELPATH

# Prepares in a fresh interpreter, so no other test can have imported TF first.
# TF is checked for in sys.modules rather than blocked: sys.modules["tensorflow"]
# = None, or a meta-path finder that raises, breaks TFDS itself (etils tests
# `"tensorflow" in sys.modules`; epath probes importlib.util.find_spec).
_PREPARE = """
import json, sys
from attnscale.data import load_tiny_shakespeare
ds = load_tiny_shakespeare(sys.argv[1])
print(json.dumps({"tensorflow_imported": "tensorflow" in sys.modules,
                  "num_train": len(ds.train)}))
"""


@pytest.fixture(scope="module")
def source_file():
  """The local tiny Shakespeare file; tests that need it skip without it."""
  root = os.environ.get(paths.ENV_VAR)
  if not root:
    pytest.skip(f"set {paths.ENV_VAR} to a folder with {RELPATH} "
                "(see attnscale/data/paths.py); these tests never download")
  return pathlib.Path(root) / RELPATH


@pytest.fixture(scope="module")
def prepared(source_file, tmp_path_factory):
  """(data_dir, report) after preparing tiny_shakespeare_char in subprocesses.

  Two at once into one data dir, as two pytest-xdist workers or training
  processes on one host would (`paths.prepare` serialises them): both succeed.
  """
  data_dir = tmp_path_factory.mktemp("tfds")
  env = dict(os.environ, PYTHONPATH=str(REPO))
  procs = [subprocess.Popen([sys.executable, "-c", _PREPARE, str(data_dir)], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for _ in range(2)]
  reports = []
  for proc in procs:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    reports.append(json.loads(out.strip().splitlines()[-1]))
  assert reports[0] == reports[1]
  return data_dir, reports[0]


@pytest.fixture(scope="module")
def ds(prepared):
  return data.load_tiny_shakespeare(str(prepared[0]))


@pytest.fixture(scope="module")
def text(source_file):
  return source_file.read_bytes().decode("utf-8")


def test_prepares_array_record_without_tensorflow(prepared):
  data_dir, report = prepared
  assert report == {"tensorflow_imported": False, "num_train": 1003854}
  files = sorted(p.name for p in (data_dir / "tiny_shakespeare_char/1.0.0").iterdir())
  assert "tiny_shakespeare_char-train.array_record-00000-of-00001" in files
  assert "tiny_shakespeare_char-validation.array_record-00000-of-00001" in files


def test_reads_back_whole_file_split_like_nanogpt(ds, text):
  n = len(text)
  assert n == 1115394
  assert len(ds.train) == int(n * 0.9) and len(ds.validation) == n - int(n * 0.9)
  assert ds.train.dtype == ds.validation.dtype == np.int32
  assert ds.decode(ds.train) == text[:int(n * 0.9)]
  assert ds.decode(ds.validation) == text[int(n * 0.9):]


def test_vocab_is_sorted_set_of_file(ds, text):
  assert ds.vocab == tuple(sorted(set(text))) and ds.vocab_size == 65
  sample = "First Citizen:\nBefore we proceed, hear me speak!"
  tokens = ds.encode(sample)
  assert tokens.dtype == np.int32
  assert [ds.vocab[t] for t in tokens] == list(sample)
  assert ds.decode(tokens) == sample
  with pytest.raises(ValueError, match="not in the vocabulary"):
    ds.encode("caf\u00e9")


def test_batch_is_nanogpt_windows_keyed_on_seed_and_step():
  tokens = np.arange(1000, dtype=np.int32)
  x, y = data.get_batch(tokens, batch_size=8, seq_len=16, seed=3, step=7)
  assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int32
  starts = np.random.default_rng([3, 7]).integers(0, 1000 - 16, size=8)
  np.testing.assert_array_equal(x, starts[:, None] + np.arange(16))
  np.testing.assert_array_equal(y, x + 1)  # tokens[i+1:i+T+1]


def test_batches_deterministic_and_fresh_each_step(ds):
  kw = dict(batch_size=8, seq_len=32, seed=0)
  x0, y0 = data.get_batch(ds.train, step=5, **kw)
  x1, y1 = data.get_batch(ds.train, step=5, **kw)  # As after a resume.
  np.testing.assert_array_equal(x0, x1)
  np.testing.assert_array_equal(y0, y1)
  np.testing.assert_array_equal(x0[:, 1:], y0[:, :-1])
  assert not np.array_equal(x0, data.get_batch(ds.train, step=6, **kw)[0])
  assert not np.array_equal(
      x0, data.get_batch(ds.train, step=5, **{**kw, "seed": 1})[0])


def test_process_slices_concatenate_to_global_batch(ds):
  kw = dict(batch_size=12, seq_len=16, seed=1, step=2)
  x, y = data.get_batch(ds.train, **kw)
  parts = [data.get_batch(ds.train, process_index=p, process_count=3, **kw)
           for p in range(3)]
  assert all(px.shape == (4, 16) for px, _ in parts)
  np.testing.assert_array_equal(np.concatenate([px for px, _ in parts]), x)
  np.testing.assert_array_equal(np.concatenate([py for _, py in parts]), y)


def test_get_batch_validates_arguments():
  tokens = np.arange(10, dtype=np.int32)
  kw = dict(seq_len=4, seed=0, step=0)
  with pytest.raises(ValueError, match="batch_size=6 must be divisible"):
    data.get_batch(tokens, batch_size=6, process_count=4, **kw)
  with pytest.raises(ValueError, match="process_index"):
    data.get_batch(tokens, batch_size=4, process_index=2, process_count=2, **kw)
  with pytest.raises(ValueError, match="tokens must be 1-D with at least"):
    data.get_batch(tokens, batch_size=2, seq_len=10, seed=0, step=0)


@pytest.mark.parametrize("num_tokens", [2, 97, 8 * 4 + 1])  # tiny, ragged, exact
def test_eval_batches_cover_each_target_once_small(num_tokens):
  _check_eval_cover(np.arange(num_tokens, dtype=np.int32), batch_size=4, seq_len=8)


def test_eval_batches_cover_validation_split(ds):
  _check_eval_cover(ds.validation, batch_size=16, seq_len=256)


def _check_eval_cover(tokens, *, batch_size, seq_len):
  batches = list(data.eval_batches(tokens, batch_size=batch_size, seq_len=seq_len))
  for b in batches:
    assert b["inputs"].shape == b["targets"].shape == b["weights"].shape
    assert b["inputs"].shape == (batch_size, seq_len)
    assert b["inputs"].dtype == b["targets"].dtype == np.int32
    assert b["weights"].dtype == np.float32
  weights = np.concatenate([b["weights"].ravel() for b in batches])
  kept = weights == 1
  assert np.all((weights == 0) | kept) and kept.sum() == len(tokens) - 1
  # Flattened in order, the weighted windows are exactly tokens[:-1] -> [1:].
  inputs = np.concatenate([b["inputs"].ravel() for b in batches])[kept]
  targets = np.concatenate([b["targets"].ravel() for b in batches])[kept]
  np.testing.assert_array_equal(inputs, tokens[:-1])
  np.testing.assert_array_equal(targets, tokens[1:])
  assert kept[:len(tokens) - 1].all()  # Padding only at the end.


def test_no_data_root_means_download(monkeypatch):
  monkeypatch.delenv(paths.ENV_VAR, raising=False)
  assert paths.data_root() is None
  assert paths.local_file("tinyshakespeare/input.txt", "http://x", None) is None


def test_a_relative_data_root_is_refused_in_one_line(monkeypatch):
  """A relative ATTNSCALE_DATA means another folder in every process that starts
  elsewhere (a notebook in notebooks/, a sweep's runs): refused, naming the fix."""
  monkeypatch.setenv(paths.ENV_VAR, "../shared/data")
  with pytest.raises(FileNotFoundError) as err:
    paths.data_root()
  message = str(err.value)
  assert "\n" not in message
  assert message.startswith("ATTNSCALE_DATA=../shared/data is a relative path")
  assert "export ATTNSCALE_DATA=$PWD/../shared/data" in message


def test_missing_file_error_says_where_to_put_it(monkeypatch, tmp_path):
  monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "empty"))
  builder = tiny_shakespeare.TinyShakespeareChar
  expected = str(tmp_path / "empty" / builder.RELPATH)
  with pytest.raises(FileNotFoundError, match=re.escape(expected)) as err:
    data.load_tiny_shakespeare(str(tmp_path / "tfds"))
  assert builder.URL in str(err.value)


def test_corrupted_local_copy_fails_checksum(monkeypatch, tmp_path, text):
  bad = tmp_path / "root" / RELPATH
  bad.parent.mkdir(parents=True)
  bad.write_text(text.replace("ROMEO", "ROMEA", 1))
  monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "root"))
  with pytest.raises(ValueError, match=f"sha256 mismatch for {re.escape(str(bad))}"):
    data.load_tiny_shakespeare(str(tmp_path / "tfds"))


def test_download_path_checks_sha256(monkeypatch, tmp_path, source_file):
  """The online branch, served from localhost: verified download, then a mismatch."""
  with serve_directory(source_file.parent) as url:
    monkeypatch.delenv(paths.ENV_VAR)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    builder = tiny_shakespeare.TinyShakespeareChar
    monkeypatch.setattr(builder, "URL", f"{url}/input.txt")
    assert len(data.load_tiny_shakespeare(str(tmp_path / "ok")).validation) == 111540
    monkeypatch.setattr(builder, "SHA256", "0" * 64)
    # TFDS's NonMatchingChecksumError, which tfds does not export publicly.
    with pytest.raises(Exception, match="has wrong checksum"):
      data.load_tiny_shakespeare(str(tmp_path / "bad"))


def offline_env(**extra: str) -> dict[str, str]:
  """os.environ as on a machine without network: every proxy variable points at a
  closed localhost port, so `requests` (the probe's and TFDS's download alike)
  cannot connect, and ATTNSCALE_DATA is unset."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    closed = f"http://127.0.0.1:{s.getsockname()[1]}"
  env = {k: v for k, v in os.environ.items()
         if k.lower() not in ("no_proxy", "all_proxy") and k != paths.ENV_VAR}
  for name in ("http_proxy", "https_proxy"):
    env[name] = env[name.upper()] = closed
  return {**env, **extra}


def test_offline_without_data_root_is_one_line_naming_it_in_seconds(tmp_path):
  """train.py with a fresh TFDS data dir, no ATTNSCALE_DATA and no network: the
  download's own path (TFDS retries for about 200 s, then a long traceback)
  is cut short by a probe that names ATTNSCALE_DATA and the file."""
  start = time.monotonic()
  proc = subprocess.run(
      [sys.executable, "train.py", "--config=configs/shakespeare_char.py:preset=test",
       f"--workdir={tmp_path / 'run'}", f"--config.data_dir={tmp_path / 'tfds'}"],
      cwd=REPO, capture_output=True, text=True, timeout=120,
      env=offline_env(JAX_PLATFORMS="cpu"))
  elapsed = time.monotonic() - start
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last == (f"error: cannot reach raw.githubusercontent.com to download "
                  f"{tiny_shakespeare.TinyShakespeareChar.URL} (ProxyError): offline, set "
                  f"ATTNSCALE_DATA to a folder holding {RELPATH} "
                  "(docs/guides/training.md#offline-data)"), proc.stderr[-3000:]
  assert elapsed < 30, elapsed


def test_wrong_data_root_is_never_ignored(prepared, monkeypatch, tmp_path, capsys):
  """The dataset is prepared (its source is not read again): a root that does not
  exist is an error, one without the file a warning naming it."""
  data_dir = str(prepared[0])
  monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "nosuch"))
  with pytest.raises(FileNotFoundError) as err:
    data.load_tiny_shakespeare(data_dir)
  assert str(err.value).startswith(f"ATTNSCALE_DATA={tmp_path / 'nosuch'} is not a folder")
  monkeypatch.setenv(paths.ENV_VAR, str(tmp_path))
  assert len(data.load_tiny_shakespeare(data_dir).validation) == 111540
  assert capsys.readouterr().err.splitlines() == [
      f"warning: ATTNSCALE_DATA={tmp_path} holds no {RELPATH}; reading the copy prepared "
      f"before in {prepared[0]}/tiny_shakespeare_char/1.0.0"]
