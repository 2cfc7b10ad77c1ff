"""The run declared once: `attnscale.config.RunConfig`.

A field is one declaration: from it alone it is checked, documented in the
generated reference, classified for packing and resume, and migrated for a run
saved before it existed. Below the entry points nothing reads a ConfigDict by
`config.get`. A start builds its optimizer, its abstract model and its task check
once (train.py, a pack, eval.py).
"""

import dataclasses
import json
import os
import re

import pytest

from attnscale import fields, tasks
from attnscale.config import labels, migration, run
from attnscale.fields import field
from attnscale.runtime import config_reference, configlib, packing
from configs import shakespeare_char

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class _WithNewField(run.RunConfig):
  """RunConfig with one field more, declared as a new field of the project would be."""

  new_rate: float = field(0.5, "a rate that runs made before it did not have",
                          kind="traced", positive=">= 0", since=0.0)


def test_a_new_field_is_one_declaration(monkeypatch):
  monkeypatch.setattr(run, "RunConfig", _WithNewField)
  config = shakespeare_char.get_config("preset=test")
  config.unlock()
  config.new_rate = 0.25

  # Validated and typed ...
  read = run.read(config, num_devices=1)
  assert isinstance(read, _WithNewField) and read.new_rate == 0.25
  assert read.hparams["new_rate"] == 0.25  # ... a number a packed step takes as an array
  config.new_rate = -1.0
  with pytest.raises(ValueError, match=re.escape("config.new_rate must be >= 0, got -1.0")):
    run.read(config, num_devices=1)
  config.new_rate = 0.25
  # ... documented in the generated reference ...
  assert re.search(r"\| `new_rate` \| `0.5` \|[^\n]* \| traced \| a rate that runs made before "
                   r"it did not have \|", config_reference.render())
  # ... classified for packing (may differ in a pack) and resume (may not change) ...
  assert "new_rate" in run.pack_free_fields() and "new_rate" not in run.resumable_fields()
  assert "new_rate" in fields.traced(_WithNewField)
  # ... and an old run's config.json gets the value that reproduces it.
  saved = json.loads(shakespeare_char.get_config("preset=test").to_json())
  assert migration.migrate(saved)["new_rate"] == 0.0


def test_packing_and_resume_rules_come_from_the_declarations():
  kinds = {f.name: f.metadata["kind"] for f in fields.declared(run.RunConfig)}
  assert packing.TRACED_FIELDS == tuple(k for k, v in kinds.items() if v in ("traced", "switch"))
  assert packing.SWITCHES == ("grad_clip", "qk_clip", "z_loss")
  assert set(configlib.RESUMABLE_CHANGES) == {
      k for k, v in kinds.items() if v in ("bookkeeping", "layout")} | {"eval_tokens"}
  assert "mesh" in configlib.RESUMABLE_CHANGES and "mesh" not in packing.PACK_FREE_FIELDS
  # Every field of the configs is declared: by RunConfig, the model or the task.
  for name in shakespeare_char.get_config().keys():
    assert name in run.top_level_fields() or name == "model", name


def test_a_field_declared_nowhere_fails_in_one_line():
  config = shakespeare_char.get_config("preset=test")
  config.unlock()
  config.lerning_rate = 0.1
  with pytest.raises(ValueError, match=re.escape(
      "config.lerning_rate is not a config field (did you mean 'learning_rate'?)")):
    run.read(config, num_devices=1)


def test_task_fields_are_declared_by_the_task_and_read_as_top_level():
  from configs import bert_small
  r = run.read(bert_small.get_config("preset=test"), num_devices=1)
  assert r.mask_rate == 0.15 and r.max_predictions_per_seq is None
  assert isinstance(r.task_fields, tasks.TASKS["mlm"].CONFIG_FIELDS)
  with pytest.raises(AttributeError, match="RunConfig has no field 'mask_rat'"):
    r.mask_rat  # noqa: B018


def test_a_sweep_declares_the_label_and_the_study_reads_it():
  config = json.loads(shakespeare_char.get_config("preset=test").to_json())
  config["model"]["positions"] = "rope"
  assert labels.of(config) == "standard"  # a run by hand: derived
  config["label"] = "my_label"
  assert labels.of(config) == "my_label"
  assert labels.run_label(config) == "standard"  # the attention setup, still derived


def test_no_config_get_below_the_entry_points():
  # The runtime, evaluation, tasks and models read a `RunConfig`'s typed fields; only
  # attnscale/config/ (which converts the ConfigDict) reads it as written.
  offenders = []
  for package in ("runtime", "evaluation", "tasks", "models", "core"):
    for dirpath, _, files in os.walk(os.path.join(ROOT, "attnscale", package)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(dirpath, name)
          with open(path) as f:
            for i, line in enumerate(f, 1):
              if re.search(r"\bconfig\.get\(", line):
                offenders.append(f"{os.path.relpath(path, ROOT)}:{i}")
  assert not offenders, offenders


@pytest.mark.slow
def test_a_start_builds_once(monkeypatch, tmp_path, tfds_dir):
  """train.py, a pack and eval.py each: one read of the config, one task check, one
  abstract initialisation (shapes and graphdef), and the optimizer built once at the
  run's numbers; a pack's step programs also build it from their traced numbers."""
  from attnscale.evaluation import eval_lib
  from attnscale.runtime import optimizers, packed, train_lib
  from attnscale.runtime import train_state as ts

  counts = {}

  def counting(owner, name):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
      counts[name] = counts.get(name, 0) + 1
      return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, wrapper)

  counting(optimizers, "build")
  counting(ts, "abstract_state")
  counting(run, "convert")
  checked = []
  original_check = tasks.CharLMTask.validate_config.__func__
  monkeypatch.setattr(tasks.CharLMTask, "validate_config",
                      classmethod(lambda cls, c: (checked.append(1), original_check(cls, c))))

  def config(seed=0):
    c = shakespeare_char.get_config(f"preset=test,seed={seed}")
    c.data_dir, c.num_train_steps, c.eval_every, c.checkpoint_every = tfds_dir, 4, 4, 4
    return c

  train_lib.train_and_evaluate(config(), str(tmp_path / "one"))
  assert counts == {"build": 1, "abstract_state": 1, "convert": 1} and len(checked) == 1

  counts.clear(), checked.clear()
  packed.train_packed([config(0), config(1)], [str(tmp_path / "a"), str(tmp_path / "b")])
  # Each run's config is read once; one start (its init's optimizer state layout); the
  # packed step and its logged twin build the optimizer from their traced numbers.
  assert counts == {"build": 3, "abstract_state": 1, "convert": 2} and len(checked) == 2

  counts.clear(), checked.clear()
  eval_lib.evaluate_run(str(tmp_path / "one"), config=eval_lib.load_config(
      str(tmp_path / "one")))
  assert counts == {"build": 1, "abstract_state": 1, "convert": 1} and len(checked) == 1
