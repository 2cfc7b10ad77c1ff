"""Tasks: the registry and contract, the char LM's choice of corpus, config checks.

The WikiText-2 character tests read the session's synthetic WikiText
(tests/conftest.py); tiny Shakespeare and the real WikiText-2 need
$ATTNSCALE_DATA (CI sets it) and skip without it.
"""

import inspect
import math
import os
import re

import numpy as np
import pytest

from attnscale import tasks
from attnscale.data import char_lm, paths, wikitext
from attnscale.evaluation import eval_lib
from attnscale.runtime import configlib
from attnscale.tasks import base
from configs import bert_small, gpt2, shakespeare_char

# ---------------------------------------------------------------------------
# The registry and the contract.


def test_registry_names_every_task_once():
  assert list(tasks.TASKS) == ["char_lm", "mlm", "token_lm", "trigger", "mqar",
                               "max_retrieval"]
  assert tasks.TASKS["char_lm"] is tasks.CharLMTask and tasks.TASKS["mlm"] is tasks.MLMTask
  assert tasks.TASKS["token_lm"] is tasks.TokenLMTask
  for cls in tasks.TASKS.values():
    assert issubclass(cls, base.Task) and not inspect.isabstract(cls), cls
    assert cls.DATASETS, cls  # every task names the corpora it can load
  for config in (shakespeare_char.get_config("preset=test"),
                 bert_small.get_config("preset=test"), gpt2.get_config("preset=test")):
    assert tasks.task_class(config) is tasks.TASKS[config.task]


def test_names_importable_from_the_package():
  # What tests, benchmarks and notebooks import from attnscale.tasks.
  for name in ("CharLMTask", "MLMTask", "TASKS", "Task", "cross_entropy", "get_task",
               "padding_mask", "sample", "task_class"):
    assert hasattr(tasks, name), name


def test_unknown_task_is_a_one_line_error():
  config = shakespeare_char.get_config("preset=test")
  config.task = "mlx"
  for check in (configlib.validate, tasks.get_task):
    with pytest.raises(ValueError, match=re.escape(
        "config.task must be one of ['char_lm', 'mlm', 'token_lm', 'trigger', 'mqar', "
        "'max_retrieval'], got 'mlx'")):
      check(config)


class _ToyTask(base.Task):
  """A task in a few lines: what a new one has to provide."""

  DATASETS = ("toy",)
  validated = []

  @classmethod
  def validate_config(cls, config):
    super().validate_config(config)
    cls.validated.append(config.dataset)

  def __init__(self, config):
    super().__init__(config)
    self.loaded = True

  def train_batch(self, step):
    return {"inputs": np.full((1, 2), step)}

  def val_batch(self, index):
    return self.train_batch(index)

  def eval_batches(self, batch_size=None):
    yield self.train_batch(0)

  def loss(self, model, batch, dropout_key=None):
    return 0.0, {}

  def eval_metrics(self, sums):
    return {"toy_metric": 1.0}

  @classmethod
  def format_summary(cls, result):
    return [f"  toy metric {result['toy_metric']}"]


def test_a_new_task_is_one_class_and_one_registry_line(monkeypatch, tmp_path):
  monkeypatch.setitem(tasks.TASKS, "toy", _ToyTask)
  config = shakespeare_char.get_config("preset=test")
  config.task, config.dataset = "toy", "toy"
  configlib.validate(config)  # the generic checks, then the toy's own
  task = tasks.get_task(config)
  assert isinstance(task, _ToyTask) and task.loaded and _ToyTask.validated == ["toy", "toy"]
  assert task.sampler is None and task.attention_masks(task.train_batch(0)) == (None, None)
  assert task.tokens_per_batch == config.batch_size * config.seq_len
  config.dataset = "other"
  with pytest.raises(ValueError, match=re.escape(
      "config.dataset must be one of ['toy'], got 'other'")):
    configlib.validate(config)
  config.dataset = "toy"
  # eval.py's summary asks the run's task for its lines.
  result = {"workdir": str(tmp_path), "step": 3, "scaling": "standard", "toy_metric": 1.0,
            "attention": [{"output_std": 1.0, "entropy": 2.0, "max_logit": 3.0}]}
  summary = eval_lib.format_summary(result, config).splitlines()
  assert summary[:2] == [f"{tmp_path} @ step 3 (standard)", "  toy metric 1.0"]
  assert "max logit" in summary[2] and len(summary) == 4


def test_format_summary_lines_per_task(tmp_path):
  attention = [{"output_std": 1.0, "entropy": 2.0, "max_logit": 3.0}]
  head = {"workdir": str(tmp_path), "step": 1, "scaling": "standard", "attention": attention}
  char = {**head, "val_loss": 1.5, "bits_per_char": 1.5 / math.log(2), "val_tokens": 1000,
          "sample": {"prompt": "\n", "length": 3, "temperature": 0.8, "top_k": 200, "seed": 0,
                     "text": "abc"}}
  text = eval_lib.format_summary(char, shakespeare_char.get_config("preset=test"))
  assert "bits/char over all 1,000 validation targets" in text and "\nabc" in text
  mlm = {**head, "val_loss": 2.0, "perplexity": math.exp(2.0), "accuracy": 0.25,
         "val_masked_tokens": 40}
  text = eval_lib.format_summary(mlm, bert_small.get_config("preset=test"))
  assert "perplexity 7.39 | masked-token accuracy 0.2500 over all 40" in text
  assert "bits/char" not in text and "sample" not in text


# ---------------------------------------------------------------------------
# Config checks: each task's own, one line, before any data is loaded.


@pytest.fixture
def no_data(monkeypatch):
  """Loading any corpus fails the test: validation must come first."""

  def fail(*args, **kwargs):
    raise AssertionError("data loaded before the config was validated")

  monkeypatch.setattr(char_lm, "load", fail)
  from attnscale.data import mlm
  monkeypatch.setattr(mlm, "load_wikitext", fail)
  from attnscale.data import tokens
  monkeypatch.setattr(tokens, "load", fail)


@pytest.mark.parametrize("preset_module, overrides, message", [
    (shakespeare_char, {"dataset": "enwik8"},
     "config.dataset must be one of ['tiny_shakespeare_char', 'wikitext2_char'], "
     "got 'enwik8'"),
    (shakespeare_char, {"model.causal": False}, "model.causal must be True for task 'char_lm'"),
    (bert_small, {"dataset": "wikitext2_char"},
     "config.dataset must be one of ['wikitext2', 'wikitext2_2k', 'wikitext103'], got 'wikitext2_char'"),
    (bert_small, {"model.causal": True}, "model.causal must be False for task 'mlm'"),
    (bert_small, {"seq_len": 2}, "config.seq_len must be >= 3 for task 'mlm'"),
    (bert_small, {"mask_rate": 0.0}, "config.mask_rate must be > 0, got 0"),
    (gpt2, {"dataset": "bin"}, "config.dataset must be one of ['auto', 'nanogpt', 'llmc'], "
     "got 'bin'"),
    (gpt2, {"eval_tokens": -1}, "config.eval_tokens must be >= 0"),
], ids=["char_dataset", "char_causal", "mlm_dataset", "mlm_causal", "mlm_seq_len",
        "mlm_mask_rate", "token_dataset", "token_eval_tokens"])
def test_validate_config_errors(no_data, preset_module, overrides, message):
  config = preset_module.get_config("preset=test")
  if "model.causal" in overrides and "causal" not in config.model:
    config.model.causal = True  # the char config leaves it at ModelConfig's default
  config.update_from_flattened_dict(overrides)
  cls = tasks.task_class(config)
  for check in (cls.validate_config, configlib.validate, tasks.get_task):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
      check(config)
    assert "\n" not in str(info.value)


def test_presets_pass_their_tasks_checks(no_data):
  for module in (shakespeare_char, bert_small, gpt2):
    for preset in module.PRESETS:
      config = module.get_config(f"preset={preset}")
      tasks.task_class(config).validate_config(config)


# ---------------------------------------------------------------------------
# The char LM's corpus is config.dataset.


def char_config(dataset, data_dir, vocab_size):
  config = shakespeare_char.get_config("preset=test")
  config.dataset, config.data_dir, config.model.vocab_size = dataset, data_dir, vocab_size
  return config


@pytest.fixture
def synthetic_root(synthetic_wikitext, monkeypatch):
  """$ATTNSCALE_DATA at the synthetic WikiText (its files read unchecked)."""
  root, _ = synthetic_wikitext
  cfg = wikitext.WikitextParagraphs.builder_configs["wikitext2"]
  monkeypatch.setenv(paths.ENV_VAR, str(root))
  monkeypatch.setattr(cfg, "local_sha256", {stem: None for stem in cfg.local_sha256})
  return root


def test_wikitext2_chars_are_the_files_characters(synthetic_root, tmp_path):
  train = (synthetic_root / "wikitext-2" / "train.txt").read_bytes().decode("utf-8")
  valid = (synthetic_root / "wikitext-2" / "valid.txt").read_bytes().decode("utf-8")
  vocab = sorted(set(train) | set(valid))
  task = tasks.get_task(char_config("wikitext2_char", str(tmp_path), len(vocab)))
  assert list(task.data.vocab) == vocab  # the vocabulary comes from the data
  assert task.data.decode(task.data.train) == train  # every byte, headings included
  assert task.data.decode(task.data.validation) == valid
  assert task.eval_metrics({"loss_sum": 2.0, "count": 1.0})["val_tokens"] == len(valid) - 1
  batch = task.train_batch(0)
  assert batch["inputs"].shape == (8, 32) and batch["inputs"].max() < len(vocab)
  assert task.sampler is not None  # a char LM generates, whatever its corpus


def test_vocab_mismatch_names_the_vocab_size_to_set(synthetic_root, tmp_path):
  train = (synthetic_root / "wikitext-2" / "train.txt").read_text("utf-8")
  valid = (synthetic_root / "wikitext-2" / "valid.txt").read_text("utf-8")
  n = len(set(train) | set(valid))
  with pytest.raises(ValueError) as info:
    tasks.get_task(char_config("wikitext2_char", str(tmp_path), 65))
  assert str(info.value) == (
      f"model.vocab_size (65) must equal the vocabulary size of "
      f"config.dataset='wikitext2_char' ({n}): set --config.model.vocab_size={n}")


def needs_real_data():
  if not os.environ.get(paths.ENV_VAR):
    pytest.skip(f"needs {paths.ENV_VAR} (CI sets it)")


def test_tiny_shakespeare_is_the_default_corpus(tmp_path):
  needs_real_data()
  config = shakespeare_char.get_config("preset=test")
  config.data_dir = str(tmp_path)
  task = tasks.get_task(config)
  assert config.dataset == "tiny_shakespeare_char" and task.data.vocab_size == 65
  assert (len(task.data.train), len(task.data.validation)) == (1_003_854, 111_540)


@pytest.mark.slow
def test_real_wikitext2_chars(tmp_path):
  needs_real_data()
  task = tasks.get_task(char_config("wikitext2_char", str(tmp_path), 283))
  assert (len(task.data.train), len(task.data.validation)) == (10_780_437, 1_120_192)
  assert task.data.decode(task.data.validation[:30]) == " \n = Homarus gammarus = \n \n Ho"
