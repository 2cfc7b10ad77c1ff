"""One schema for the model config: ModelConfig's fields (default and doc) build
`config.model`, document it (docs/reference/config.md, regenerated here), and
check it; the QK norm is the model's own option (`model.qk_norm`), and runs saved
with `model.qk_layernorm` still load, resume and keep their label."""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnscale import models
from attnscale.config import builders, labels, migration, schema
from attnscale.core import scalings
from attnscale.models import ModelConfig, UnitConfig
from attnscale.runtime import cli, config_reference, configlib, rundir
from configs import bert_small, gpt2, shakespeare_char


def _all_fields(schema, prefix=""):
  for f in dataclasses.fields(schema):
    default = builders.schema_default(f)
    yield prefix + f.name, f
    if dataclasses.is_dataclass(default):
      yield from _all_fields(type(default), f"{prefix}{f.name}.")


def test_every_field_has_a_one_line_doc():
  for path, f in _all_fields(ModelConfig):
    doc = f.metadata.get("doc", "")
    assert doc and "\n" not in doc, path


@pytest.mark.parametrize("module, presets", [(shakespeare_char, shakespeare_char.PRESETS),
                                             (bert_small, bert_small.PRESETS),
                                             (gpt2, gpt2.PRESETS)])
def test_configs_build_config_model_from_the_schema(module, presets):
  fields = {f.name for f in builders.schema_fields(ModelConfig)}
  unit_fields = {f.name for f in dataclasses.fields(UnitConfig)}
  for preset in presets:
    for scaling in ("standard", "unit_scaled"):
      model = module.get_config(f"preset={preset},scaling={scaling}").model
      assert set(model.keys()) == fields and set(model.unit.keys()) == unit_fields
  # The defaults are ModelConfig's, the config argument's logic is builders.model's.
  default = schema.model_config(shakespeare_char.get_config("preset=nanogpt"))
  assert dataclasses.replace(default, dropout=0.0) == ModelConfig()
  unit = builders.model("unit_scaled")
  assert (unit.variant, unit.scaling, unit.unit.attn_residual) == ("unit", "fully_scaled",
                                                                   "relative")
  assert builders.model("key_norm_power", p=3.0).scaling_params.to_dict() == {"p": 3.0}
  assert builders.model("cosine", temperature=12.0).scaling_params.to_dict() == {
      "temperature": 12.0}
  assert builders.model("cosine").scaling_params.to_dict() == {}


def test_none_able_fields_are_typed_placeholders():
  m = builders.model()
  assert m.num_kv_heads is None and m.attention_impl is None
  m.num_kv_heads, m.attention_impl = 2, "reference"  # an override of the right type
  with pytest.raises(TypeError):
    m.num_kv_heads = "two"


def test_config_reference_is_up_to_date():
  with open(os.path.join(config_reference.ROOT, config_reference.OUTPUT)) as f:
    committed = f.read()
  assert committed == config_reference.render(), (
      f"{config_reference.OUTPUT} is stale: run `{config_reference.COMMAND}`")


def test_config_reference_documents_every_field():
  text = config_reference.render()
  for path, _ in _all_fields(ModelConfig):
    assert f"| `model.{path}` |" in text, path
  for key in shakespeare_char.get_config().keys():
    assert f"| `{key}` |" in text or key == "model", key
  assert re.search(r"\| `mask_rate` \| `0.15` \|[^\n]* \| program \| fraction of each "
                   r"row's real tokens", text)
  from attnscale import tasks  # the synthetic tasks' arguments (config.probe)
  for name, cls in tasks.TASKS.items():
    if issubclass(cls, tasks.SyntheticTask):
      for f in dataclasses.fields(cls.ARGS):
        assert f"| `{name}` | `probe.{f.name}` |" in text, (name, f.name)
  assert "| `model.dropout` | `0.0` |" in text


@pytest.mark.parametrize("field, value, message", [
    ("scaling", "bogus", "model.scaling must be one of"),
    ("qk_norm", "l2", "model.qk_norm must be one of ['none', 'layernorm', 'rmsnorm']"),
    ("num_heads", 5, "model.num_heads (5) must divide model.width"),
    ("sink", "one", "model.sink must be one of"),
])
def test_bad_model_values_fail_in_one_line_naming_the_field(field, value, message):
  config = shakespeare_char.get_config("preset=test")
  config.model[field] = value
  with pytest.raises(ValueError) as e:
    configlib.validate(config)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_qk_norm_is_the_model_s_own_normalisation():
  dims = dict(vocab_size=11, block_size=16, num_layers=1, num_heads=2, width=16)
  q = jax.random.normal(jax.random.key(0), (2, 5, 2, 8))
  k = jax.random.normal(jax.random.key(1), (2, 5, 2, 8))
  for qk_norm, scaling in (("layernorm", "qk_layernorm"), ("rmsnorm", "qk_rmsnorm")):
    model = models.build(ModelConfig(qk_norm=qk_norm, **dims), rngs=nnx.Rngs(0))
    norm = model.blocks[0].attn.qk_norm
    # The parameters a run with model.qk_layernorm=True saved: gains [H], init 1.
    assert norm.q_scale.shape == norm.k_scale.shape == (8,)
    q_scale, k_scale = 1.5 * jnp.ones(8), jnp.linspace(0.5, 2, 8)
    norm.q_scale[...], norm.k_scale[...] = q_scale, k_scale
    got_q, got_k = norm(q, k)
    want = scalings.get(scaling, q_scale=q_scale, k_scale=k_scale)(q, k, None)
    np.testing.assert_allclose(got_q, want.q, rtol=1e-6)
    np.testing.assert_allclose(got_k, want.k, rtol=1e-6)
  with pytest.raises(ValueError, match="model.qk_norm='layernorm' with scaling='cosine'"):
    ModelConfig(qk_norm="layernorm", scaling="cosine")
  with pytest.raises(ValueError, match="model.variant='unit' takes a scaling"):
    ModelConfig(qk_norm="rmsnorm", variant="unit", scaling="fully_scaled")


def _old_config_json(config) -> dict:
  """`config` as a config.json saved before qk_norm, init_std and imports."""
  old = json.loads(config.to_json())
  del old["model"]["qk_norm"], old["model"]["init_std"]
  old.pop("imports", None)
  old["model"]["qk_layernorm"] = config.model.qk_norm == "layernorm"
  return old


def test_a_run_saved_with_qk_layernorm_loads_resumes_and_keeps_its_label(tmp_path):
  config = shakespeare_char.get_config("preset=test")
  config.model.qk_norm = "layernorm"
  old = _old_config_json(config)
  migrated = migration.migrate(json.loads(json.dumps(old)))
  assert migrated == json.loads(config.to_json())
  assert labels.run_label(config) == "standard+qk_layernorm"
  # A label read straight from an old config.json (no migrate) is the same too.
  import ml_collections
  assert labels.run_label(ml_collections.ConfigDict(old)) == "standard+qk_layernorm"
  # Resuming: train.py compares today's config with the saved one.
  with open(tmp_path / "config.json", "w") as f:
    json.dump(old, f)
  rundir.save_config(config, str(tmp_path))
  config.model.qk_norm = "rmsnorm"
  with pytest.raises(ValueError, match="model.qk_norm: 'layernorm' -> 'rmsnorm'"):
    rundir.save_config(config, str(tmp_path))


def test_qk_layernorm_was_renamed_in_one_line():
  config = shakespeare_char.get_config("preset=test")
  message = cli.override_error("model.qk_layernorm", config)
  assert ("field model.qk_layernorm was renamed to model.qk_norm: use --config.model.qk_norm "
          "(model.qk_norm=layernorm for True, model.qk_norm=none for False)") in message
  config.model.qk_layernorm = True  # a config file of one's own that still sets it
  with pytest.raises(ValueError, match="model.qk_layernorm was renamed to model.qk_norm "
                     r"\(model.qk_norm=layernorm for True"):
    configlib.validate(config)
