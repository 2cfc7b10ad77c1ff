"""Rules that live with their scaling: a scaling registered outside attnscale declares
its muP rule (`scalings.MupRule`) and trains under model.parameterization=mup; one
that declares none is refused in one line saying what to declare; the config
argument's keywords and presets come from the registration too.

Training needs $ATTNSCALE_DATA (CI sets it).
"""

import dataclasses
import math

import numpy as np
import pytest
from flax import nnx

from attnscale import models
from attnscale.config import builders, labels, schema
from attnscale.core import scalings
from attnscale.core.scalings import MupRule, Preset, Scaled
from attnscale.models import ModelConfig, mup
from configs import shakespeare_char
from tests.test_mup import losses, make_config


# A test's own scaling, nowhere under attnscale/: logits mult q.k / sqrt(d).
@dataclasses.dataclass(frozen=True)
class ScaledDot:
  """s = mult / sqrt(d) (standard's, with a multiplier muP can set)."""

  mult: float = 1.0

  def __call__(self, q_BTNH, k_BSKH, keys):
    return Scaled(q_BTNH, k_BSKH, logit_scale=self.mult * q_BTNH.shape[-1] ** -0.5)


@pytest.fixture
def registered():
  """Registers test scalings for one test (the registry is global: other modules
  check that every registered scaling is tested and documented)."""
  added = []

  def register(name, **declared):
    scalings.register(name, **declared)(ScaledDot)
    added.append(name)

  yield register
  for name in added:
    scalings._REGISTRY.pop(name)


def test_a_declared_mup_rule_trains_under_mup(tfds_dir, registered):
  # muP's 1/d from a 1/sqrt(d) scaling: mult x a x sqrt(d_base / d).
  registered("test_scaled_dot", mup=MupRule(width=lambda d_base, d: math.sqrt(d_base / d)))
  config = make_config(tfds_dir, "preset=test", **{"model.scaling": "test_scaled_dot",
                                                     "model.parameterization": "mup",
                                                     "model.mup_attn_mult": 2.0})
  cfg = schema.model_config(config)  # width 32, 2 heads, base_width 64: d 16, d_base 32
  assert mup.attention_scaling(cfg) == ("test_scaled_dot", {"mult": 2.0 * math.sqrt(2.0)})
  model = models.build(cfg, rngs=nnx.Rngs(0))
  assert model.blocks[0].attn.scale_fn().mult == 2.0 * math.sqrt(2.0)
  got = losses(config, 3)
  assert np.all(np.isfinite(got)) and got[-1] < got[0]


def test_a_rule_may_build_another_scaling(registered):
  # standard's own rule: inverse_d with mult a sqrt(d_base), the same numbers.
  registered("test_like_standard",
             mup=MupRule(use="inverse_d", width=lambda d_base, d: math.sqrt(d_base)))
  base = dict(width=256, num_heads=4, base_width=64, parameterization="mup",
              mup_attn_mult=2.0)
  assert (mup.attention_scaling(ModelConfig(scaling="test_like_standard", **base))
          == mup.attention_scaling(ModelConfig(scaling="standard", **base))
          == ("inverse_d", {"mult": 8.0}))


def test_no_width_rule_keeps_the_scaling_and_needs_mult_one(registered):
  registered("test_bounded", mup=MupRule(mult=None, why="its logits are bounded"))
  cfg = ModelConfig(scaling="test_bounded", width=192, parameterization="mup")
  assert mup.attention_scaling(cfg) == ("test_bounded", {})
  with pytest.raises(ValueError, match=r"\(its logits are bounded\): use model.mup_attn_mult=1"):
    ModelConfig(scaling="test_bounded", parameterization="mup", mup_attn_mult=2.0)


def test_an_undeclared_scaling_is_refused_under_mup(registered):
  registered("test_undeclared")
  ModelConfig(scaling="test_undeclared")  # sp takes it
  with pytest.raises(ValueError) as info:
    ModelConfig(scaling="test_undeclared", parameterization="mup")
  message = str(info.value)
  assert "\n" not in message
  assert message.startswith("model.parameterization='mup' cannot apply: "
                            "scaling='test_undeclared' declares no muP rule")
  assert "mup=scalings.MupRule(...)" in message and "mup='why none applies'" in message


def test_a_declared_reason_is_the_refusal(registered):
  registered("test_no_mup", mup="its logits depend on the data, and no muP rule fits")
  with pytest.raises(ValueError, match="scaling='test_no_mup': its logits depend on the data"):
    ModelConfig(scaling="test_no_mup", parameterization="mup")
  with pytest.raises(TypeError, match=r"mup=\.\.\.\) takes a scalings.MupRule or a string"):
    scalings.register("test_bad_rule", mup=2.0)


def test_every_builtin_scaling_declares_its_mup_rule():
  """A reason or a rule for each, so muP's refusals say why rather than 'declare one'."""
  assert all(scalings.entry(name).mup for name in scalings.names())
  ruled = {n for n in scalings.names() if isinstance(scalings.entry(n).mup, MupRule)}
  assert ruled == {"standard", "inverse_d", "cosine", "qk_rmsnorm", "qk_layernorm"}


def test_config_args_and_presets_come_from_the_registration(registered):
  registered("test_arg", config_args=("p",))
  registered("test_preset", presets={"test_in_unit": Preset("unit", {"unit.scaled_loss": False})})
  # The config argument's p (not learned: always passed), and no other; another
  # argument set away from its default is an error naming what the scaling takes.
  assert builders.model("test_arg", p=3.0).scaling_params.to_dict() == {"p": 3.0}
  with pytest.raises(ValueError, match=r"s=1 does not apply to scaling=test_arg \(it takes: p\)"):
    builders.model("test_arg", p=3.0, s=1.0)
  with pytest.raises(ValueError, match=r"gamma=2 does not apply to scaling=log_n \(it takes: s\)"):
    shakespeare_char.get_config("preset=test,scaling=log_n,gamma=2")
  config = shakespeare_char.get_config("preset=test,scaling=log_n_power,p=0.5,gamma=2")
  assert labels.run_label(config) == "log_n_power(gamma=2,p=0.5)"
  config = shakespeare_char.get_config("preset=test,scaling=n_power,a=0.25")
  assert dict(config.model.scaling_params) == {"gamma": 1.0, "a": 0.25}
  with pytest.raises(ValueError, match=r"config_args takes keywords of \('p', 'temperature', 's', "
                                       r"'gamma', 'a'\)"):
    scalings.register("test_bad_arg", config_args=("q",))
  m = builders.model("test_in_unit")
  assert (m.scaling, m.variant, m.unit.scaled_loss) == ("test_preset", "unit", False)
  config = shakespeare_char.get_config("preset=test,scaling=test_in_unit")
  assert labels.run_label(config) == "test_in_unit"
  assert scalings.presets()["unit_scaled"] == (
      "fully_scaled", Preset("unit", {"unit.attn_residual": "relative"}))
