"""The token LM (configs/gpt2.py, task token_lm): shards in nanoGPT's and llm.c's formats
read back what was written; the prepare command tokenizes tiny Shakespeare into them
(bytes: offline) and says in one line what GPT-2's BPE needs offline; batches are a
function of (seed, step) and split between processes; evaluation scores each target
once; the test preset trains, evaluates and, killed with SIGKILL, resumes with the same
data order (slow). spm8k (on synthetic WikiText-shaped files, no $ATTNSCALE_DATA): the
shards hold each split's own articles, the vocabulary comes from the training file
alone, decoding inverts encoding up to normalisation, and the test preset trains and
samples on them.

Needs $ATTNSCALE_DATA for the tests on tiny Shakespeare (CI sets it).
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from attnscale import testing
from attnscale.config import schema
from attnscale.data import lm_tokenizers, prepare_tokens, tokens
from attnscale.experiments import run_records, sweeps
from attnscale.runtime import metrics_writer
from configs import gpt2


@pytest.fixture(scope="module")
def shakespeare():
  root = os.environ.get("ATTNSCALE_DATA")
  if not root:
    pytest.skip("needs ATTNSCALE_DATA (CI sets it)")
  with open(os.path.join(root, "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
    return os.path.join(root, "tinyshakespeare"), f.read()


@pytest.fixture(scope="module")
def shards(shakespeare, tmp_path_factory):
  """{format: folder} of tiny Shakespeare's bytes, made by the prepare command."""
  out = {}
  for fmt in ("llmc", "nanogpt"):
    folder = str(tmp_path_factory.mktemp(f"shards_{fmt}"))
    assert prepare_tokens.main([f"--input={shakespeare[0]}", f"--out={folder}",
                                "--tokenizer=bytes", f"--format={fmt}",
                                "--shard_tokens=400000", "--workers=1"]) == 0
    out[fmt] = folder
  return out


def test_both_formats_read_back_the_tokens_written(tmp_path):
  tokens_N = np.random.default_rng(0).integers(0, 2**16, size=1000)
  tokens_N[:2] = 0, 2**16 - 1
  for fmt in ("llmc", "nanogpt"):
    path = str(tmp_path / f"{fmt}_train.bin")
    tokens.write_shard(path, tokens_N, fmt)
    for read_as in (fmt, "auto"):
      np.testing.assert_array_equal(tokens.read_shard(path, read_as), tokens_N)
  header = np.fromfile(tmp_path / "llmc_train.bin", "<i4", count=3)
  assert header.tolist() == [20240520, 1, 1000]  # llm.c's magic, version, count
  # Three shards read as one stream, across their boundaries.
  stream = tokens.TokenStream([tokens_N[:300], tokens_N[300:301], tokens_N[301:]])
  np.testing.assert_array_equal(stream.read(250, 600), tokens_N[250:850])


def test_bad_shards_are_one_line(tmp_path):
  path = str(tmp_path / "x_train.bin")
  tokens.write_shard(path, np.arange(10), "llmc")
  with open(path, "ab") as f:
    f.write(b"\0\0")
  with pytest.raises(ValueError, match="the header says 10 tokens but the file holds 11"):
    tokens.read_shard(path)
  tokens.write_shard(path, np.arange(10), "nanogpt")
  with pytest.raises(ValueError, match="no llm.c header"):
    tokens.read_shard(path, "llmc")
  with pytest.raises(ValueError, match=r"must fit uint16"):
    tokens.write_shard(path, np.array([70000]), "nanogpt")
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="config.data_dir=.* has no train shards"):
    tokens.load(str(tmp_path / "empty"))


def test_prepare_writes_the_tokenizers_tokens(shards, shakespeare):
  text = shakespeare[1]
  want = np.array([256, *text.encode("utf-8")])  # end-of-text, then the document
  for fmt, folder in shards.items():
    data = tokens.load(folder)
    got = np.concatenate([data.validation.read(0, len(data.validation)),
                          data.train.read(0, len(data.train))])
    np.testing.assert_array_equal(got, want, err_msg=fmt)
    assert len(data.validation) == len(want) // 10  # a small input: its first tenth
    assert data.meta["tokenizer"] == "bytes" and data.vocab_size == 257
  # llm.c's numbering: the validation shard first, then 400k-token training shards.
  names = sorted(f for f in os.listdir(shards["llmc"]) if f.endswith(".bin"))
  prefix = os.path.basename(shards["llmc"])  # --out's name
  assert names == [f"{prefix}_train_00000{i}.bin" for i in (1, 2, 3)] + [
      f"{prefix}_val_000000.bin"], names
  assert sorted(f for f in os.listdir(shards["nanogpt"]) if f.endswith(".bin")) == [
      "train.bin", "val.bin"]


def test_gpt2_bpe_offline_is_one_line(tmp_path, monkeypatch, capsys):
  import tiktoken

  def offline(name):
    raise ConnectionError("no network")
  monkeypatch.setattr(tiktoken, "get_encoding", offline)
  monkeypatch.delenv("ATTNSCALE_DATA", raising=False)
  assert prepare_tokens.main([f"--input={tmp_path}", f"--out={tmp_path / 'out'}"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(
      "error: GPT-2's BPE vocabulary could not be read from the network (offline?)"), err
  assert "TIKTOKEN_CACHE_DIR" in err[0] and "$ATTNSCALE_DATA/gpt2/" in err[0]
  with pytest.raises(ValueError, match=f"could not be read in {tmp_path}"):
    lm_tokenizers.get("gpt2", vocab_dir=str(tmp_path))  # a local copy that is not there


def test_batches_are_a_function_of_seed_and_step_split_between_processes(shards):
  stream = tokens.load(shards["llmc"]).train
  kw = dict(batch_size=8, seq_len=16, seed=3)
  inputs, targets = tokens.get_batch(stream, step=5, **kw)
  np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
  again = tokens.get_batch(stream, step=5, **kw)
  np.testing.assert_array_equal(again[0], inputs)
  assert not np.array_equal(tokens.get_batch(stream, step=6, **kw)[0], inputs)
  rows = [tokens.get_batch(stream, step=5, process_index=p, process_count=4, **kw)[0]
          for p in range(4)]
  np.testing.assert_array_equal(np.concatenate(rows), inputs)


def test_eval_batches_score_each_target_once(shards):
  stream = tokens.load(shards["nanogpt"]).validation
  batches = list(tokens.eval_batches(stream, batch_size=8, seq_len=100))
  assert sum(b["weights"].sum() for b in batches) == len(stream) - 1
  first = tokens.eval_batches(stream, batch_size=8, seq_len=100, max_tokens=1000)
  assert sum(b["weights"].sum() for b in first) == 1000
  # Two processes' rows, interleaved back, are the one-process batches.
  halves = [list(tokens.eval_batches(stream, batch_size=8, seq_len=100, process_index=p,
                                     process_count=2)) for p in range(2)]
  for whole, a, b in zip(batches, *halves):
    for key in whole:
      np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), whole[key])


def test_configs_and_sweeps():
  for preset in gpt2.PRESETS:
    c = gpt2.get_config(f"preset={preset}")
    assert c.batch_size % c.grad_accum_steps == 0
  small = schema.model_config(gpt2.get_config("preset=small"))
  assert (small.num_layers, small.width, small.num_heads, small.block_size,
          small.vocab_size) == (12, 768, 12, 1024, 50304)
  assert gpt2.get_config("preset=small").batch_size * 1024 == 524288
  with pytest.raises(ValueError, match="tokenizer must be one of"):
    gpt2.get_config("tokenizer=llama")
  # Each config's own sweeps file: configs/gpt2_sweeps.py, configs/shakespeare_char_sweeps.py.
  seeds = [p.name for p in sweeps.load_sweep("configs/gpt2.py", "seeds")]
  assert len(seeds) == 6 and "small-standard-0-shared_kvTrue" in seeds
  assert "small-standard-0-num_kv_heads6" in seeds and "small-qk_rmsnorm-0" in seeds
  assert sweeps.load_sweep("configs/shakespeare_char.py", "test")


def _config(folder, **fields):
  config = gpt2.get_config("preset=test")
  config.data_dir = folder
  config.update_from_flattened_dict(fields)
  return config


def test_trains_on_the_shards_and_evaluates(shards, tmp_path_factory):
  """The test preset (2 micro-batches a step) on llm.c shards, then eval.py's evaluation:
  the config's first 2048 validation targets, and the whole split on request."""
  from attnscale.evaluation import eval_lib
  run = testing.train_tiny_run(tmp_path_factory, config=_config(shards["llmc"]))
  rows = [r for r in metrics_writer.read_rows(run.workdir) if "train/loss" in r]
  assert rows[-1]["train/loss"] < rows[0]["train/loss"] < 6.0  # ln 320 = 5.77 at init
  result = eval_lib.evaluate_run(run.workdir, sample_length=5)
  assert result["val_tokens"] == 2048 and result["val_loss"] < 5.0
  assert result["tokenizer"] == "bytes" and len(result["sample"]["text"]) <= 5
  whole = eval_lib.evaluate_run(run.workdir, sample_length=1, whole_split=True)
  assert whole["val_tokens"] == whole["val_split_tokens"] == 111538
  summary = eval_lib.format_summary(whole)
  assert "over all 111,538 validation targets (bytes tokens)" in summary, summary


def test_missing_shards_and_small_vocabulary_are_one_line(shards, tmp_path):
  from attnscale import tasks
  with pytest.raises(ValueError, match="config.data_dir=.* is not a folder: python -m "
                     "attnscale.data.prepare_tokens"):
    tasks.get_task(_config(str(tmp_path / "nowhere")))
  with pytest.raises(ValueError, match=r"model.vocab_size \(100\) must be >= .* \(bytes: 257\)"):
    tasks.get_task(_config(shards["llmc"], **{"model.vocab_size": 100}))


@pytest.mark.slow
def test_sigkill_then_rerun_reads_the_same_batches(shards, tmp_path):
  """train.py on the shards, killed with SIGKILL past a checkpoint, rerun: every step's
  loss equals the uninterrupted run's, so the data order continued exactly."""
  cache, log = tmp_path / "xla_cache", tmp_path / "log"
  flags = (f"--config.data_dir={shards['nanogpt']}", "--config.num_train_steps=300",
           "--config.log_every=1", "--config.checkpoint_every=50", "--config.eval_every=300")
  config = "configs/gpt2.py:preset=test"
  straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
  testing.finish(testing.start_train_py(straight, log, *flags, cache_dir=cache,
                                        config=config), log)
  proc = testing.start_train_py(resumed, log, *flags, cache_dir=cache, config=config)

  def past_a_checkpoint():
    saved = run_records.checkpoint_steps(resumed)
    logged = [r["step"] for r in metrics_writer.read_rows(resumed)]
    return bool(saved and logged and logged[-1] >= saved[-1] + 5)

  testing.wait_for(proc, past_a_checkpoint, "a checkpoint and 5 steps past it", log)
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=60)
  restored = run_records.checkpoint_steps(resumed)[-1]
  assert restored < 300
  testing.finish(testing.start_train_py(resumed, log, *flags, cache_dir=cache, config=config),
                 log)
  assert f"resumed from {resumed} at step {restored}" in log.read_text()
  losses = [{r["step"]: r["train/loss"] for r in metrics_writer.read_rows(d)
             if "train/loss" in r} for d in (straight, resumed)]
  assert sorted(losses[1]) == list(range(1, 301))
  assert losses[1] == losses[0]
  result = subprocess.run([sys.executable, "eval.py", f"--workdir={resumed}", "--length=5"],
                          cwd=testing.ROOT, capture_output=True, text=True, timeout=300,
                          env=testing.subprocess_env(JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-2000:]
  with open(os.path.join(resumed, "eval.json")) as f:
    assert json.load(f)["step"] == 300


# spm8k: WikiText's articles with a SentencePiece vocabulary trained on its training split.

_WORDS = ("the of and in to a was is for on as with by he at from his an were that which "
          "game season city war film song album river player church station national").split()


def _wikitext(seed: int, num_articles: int, extra: str = "") -> str:
  """WikiText-shaped text: ' = Title = ' between blank lines, sections, paragraphs
  (`extra` appended to each paragraph)."""
  rng = np.random.default_rng(seed)
  lines = []
  for a in range(num_articles):
    lines += [" ", f" = Article {seed} {a} = ", " "]
    for s in range(2):
      lines += [f" = = Section {s} = = ", " "]
      words = rng.choice(_WORDS, size=int(rng.integers(40, 120)))
      lines += [" " + " ".join(words) + f" <unk> , 1 @,@ 000 {extra}", " "]
  return "\n".join(lines) + "\n"


VALID_ONLY = "quokkaquokka ξ"  # a word and a character only the validation text has


@pytest.fixture(scope="module")
def wikitext_spm8k(tmp_path_factory):
  """(WikiText folder, shards folder) made by the prepare command with spm8k."""
  src = tmp_path_factory.mktemp("wikitext")
  for stem, seed, n, extra in (("train", 0, 30, ""), ("valid", 1, 6, VALID_ONLY),
                               ("test", 2, 2, VALID_ONLY)):
    (src / f"{stem}.txt").write_text(_wikitext(seed, n, extra), encoding="utf-8")
  out = str(tmp_path_factory.mktemp("wikitext_spm8k"))
  assert prepare_tokens.main([f"--input={src}", f"--out={out}", "--tokenizer=spm8k",
                              "--workers=1"]) == 0
  return src, out


def test_wikitext_articles_start_at_titles_between_blank_lines():
  from attnscale.data import wikitext
  text = (" \n = A = \n \n x \n = = S = = \n \n y = 2 \n = 1 k = \n z \n \n = B ( b ) = \n \n w \n")
  got = wikitext.articles(text)
  assert got == [" = A = \n \n x \n = = S = = \n \n y = 2 \n = 1 k = \n z \n ",
                 " = B ( b ) = \n \n w \n"]  # "= 1 k =" has text next to it: not a title
  assert "\n".join(got) == text[len(" \n"):]


def test_spm8k_prepare_writes_shards_model_and_meta(wikitext_spm8k):
  src, out = wikitext_spm8k
  meta = json.load(open(os.path.join(out, tokens.META_FILE)))
  assert meta["tokenizer"] == "spm8k" and meta["tokenizer_model"] == "tokenizer.model"
  assert meta["eot"] == 3 and meta["tokenizer_seed"] == 0
  assert meta["documents"] == 36 and 100 < meta["vocab_size"] <= 8192  # a small corpus
  prefix = os.path.basename(out)
  assert sorted(f for f in os.listdir(out) if f.endswith(".bin")) == [
      f"{prefix}_train_000001.bin", f"{prefix}_val_000000.bin"]
  # Each split: every article of its own file, end-of-text first, nothing else.
  tok = lm_tokenizers.from_meta(meta, out)
  data = tokens.load(out)
  from attnscale.data import wikitext
  for stream, stem in ((data.train, "train"), (data.validation, "valid")):
    docs = wikitext.articles((src / f"{stem}.txt").read_text(encoding="utf-8"))
    want = np.concatenate([[tok.eot, *tok.encode(d)] for d in docs])
    np.testing.assert_array_equal(stream.read(0, len(stream)), want, err_msg=stem)
    assert meta["tokens"]["train" if stem == "train" else "validation"] == len(want)


def test_spm8k_round_trip_and_end_of_text(wikitext_spm8k):
  from attnscale.data import tokenizer as tokenizer_lib
  _, out = wikitext_spm8k
  tok = lm_tokenizers.get("spm8k", model_file=os.path.join(out, "tokenizer.model"))
  text = " = Article 9 = \n \n the game was released in the city , 1 @,@ 000 <unk> \n"
  ids = tok.encode(text)
  assert tok.eot not in ids and tok.eot not in tok.encode("[SEP] [CLS]")  # control pieces
  normalized = tokenizer_lib.Tokenizer.load(os.path.join(out, "tokenizer.model")).normalize(text)
  assert tok.decode(ids) == tok.decode([tok.eot, *ids, tok.eot]) == normalized
  assert normalized == "= article 9 = the game was released in the city , 1 @,@ 000 <unk>"
  with pytest.raises(ValueError, match="spm8k's model file .* is not there"):
    lm_tokenizers.get("spm8k", model_file=os.path.join(out, "nowhere.model"))


def test_spm8k_vocabulary_never_sees_validation_text(wikitext_spm8k, tmp_path):
  from attnscale.data import wikitext
  src, out = wikitext_spm8k
  model = open(os.path.join(out, "tokenizer.model"), "rb").read()
  # The model file is a function of the training articles alone (and the seed).
  train_docs = wikitext.articles((src / "train.txt").read_text(encoding="utf-8"))
  lm_tokenizers.train_spm8k(train_docs, str(tmp_path / "again.model"))
  assert (tmp_path / "again.model").read_bytes() == model
  tok = lm_tokenizers.get("spm8k", model_file=os.path.join(out, "tokenizer.model"))
  word, char = VALID_ONLY.split()
  assert len(tok.encode(word)) > 3  # no piece learnt from it
  assert tok.encode(char)[-1] == 1  # [UNK]: the character is not in the vocabulary


def test_spm8k_needs_a_validation_split_and_a_model(tmp_path, capsys):
  (tmp_path / "doc.txt").write_text(_wikitext(0, 3), encoding="utf-8")
  assert prepare_tokens.main([f"--input={tmp_path}", f"--out={tmp_path / 'out'}",
                              "--tokenizer=spm8k"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "spm8k needs an input with its own validation split" in err[0]
  with pytest.raises(ValueError, match="spm8k needs its model file"):
    lm_tokenizers.get("spm8k")
  config = gpt2.get_config("preset=cpu,tokenizer=spm8k")
  assert (config.model.vocab_size, config.data_dir) == (8192, "data/wikitext2_spm8k")
  with pytest.raises(ValueError, match=r"tokenizer must be one of \['gpt2', 'bytes', 'spm8k'\]"):
    gpt2.get_config("tokenizer=spm")


def test_spm8k_shards_train_and_sample(wikitext_spm8k, tmp_path_factory):
  """The test preset with tokenizer=spm8k trains a few steps on the shards
  (train.py's library path), and eval.py samples with the shards' model file."""
  from attnscale.evaluation import eval_lib
  _, out = wikitext_spm8k
  config = gpt2.get_config("preset=test,tokenizer=spm8k")
  config.data_dir = out
  run = testing.train_tiny_run(tmp_path_factory, config=config, steps=4, name="spm8k")
  rows = [r for r in metrics_writer.read_rows(run.workdir) if "train/loss" in r]
  assert rows and np.isfinite(rows[-1]["train/loss"]) and rows[0]["train/loss"] < 9.2  # ln 8192 = 9.01
  result = eval_lib.evaluate_run(run.workdir, sample_length=5)  # prompt "\n": end-of-text
  assert result["tokenizer"] == "spm8k" and isinstance(result["sample"]["text"], str)
