"""config.remat (none | full | dots): rematerialising each block changes what the
backward pass keeps, never what it computes. What it saves is measured on a
compiled TPU program (tests/test_compile_tpu.py; the XLA:CPU program's peak here is not
the activations')."""

import jax
import numpy as np
import pytest

from attnscale import tasks
from attnscale.config import schema
from attnscale.runtime import steps
from attnscale.runtime import train_state as ts
from configs import bert_small, shakespeare_char


def _one_step(config):
  mesh = ts.make_mesh(config)
  graphdef, state, shardings = ts.create_state(config, mesh)
  task = tasks.get_task(config)
  step = steps.make_train_step(graphdef, task, config, shardings, ts.batch_sharding(mesh))
  state, metrics = step(state, steps.global_batch(task.train_batch(0),
                                                  ts.batch_sharding(mesh)))
  return jax.device_get((metrics["loss"], metrics["grad_norm"], state["params"]))


@pytest.mark.heavy
@pytest.mark.parametrize("get_config", [shakespeare_char.get_config, bert_small.get_config],
                         ids=["char_lm", "mlm"])
def test_remat_changes_nothing_computed(get_config):
  config = get_config("preset=test")
  config.model.dropout = 0.1  # the recomputed forward must draw the same dropout masks
  want = _one_step(config)
  for remat in ("full", "dots"):
    config.remat = remat
    got = _one_step(config)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got[2]), jax.tree.leaves(want[2])):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_bad_remat_is_one_line():
  config = shakespeare_char.get_config("preset=test")
  config.remat = "some"
  with pytest.raises(ValueError, match=r"config.remat must be one of \['none', 'full', 'dots'\]"):
    schema.model_config(config)
