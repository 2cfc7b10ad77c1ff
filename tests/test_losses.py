"""z-loss and the output logits' stats (attnscale/tasks/losses.py), written out."""

import jax
import jax.numpy as jnp
import numpy as np

from attnscale.tasks import losses


def _logits():
  return 3.0 * jax.random.normal(jax.random.key(0), (2, 5, 7))


def test_z_loss_is_palms():
  logits = _logits()
  weights = jnp.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], jnp.float32)
  total, count = losses.z_loss(logits, weights)
  log_z = np.log(np.exp(np.asarray(logits, np.float64)).sum(-1))
  np.testing.assert_allclose(total, (log_z ** 2 * np.asarray(weights)).sum(), rtol=1e-5)
  assert float(count) == 7
  total, count = losses.z_loss(logits)  # no weights: every token
  np.testing.assert_allclose(total, (log_z ** 2).sum(), rtol=1e-5)
  assert float(count) == 10


def test_z_loss_is_zero_and_flat_where_z_is_one():
  # log Z = 0: no loss and no gradient; a shift of the logits moves log Z and the loss.
  logits = jax.nn.log_softmax(_logits())
  total, _ = losses.z_loss(logits)
  np.testing.assert_allclose(total, 0.0, atol=1e-8)
  np.testing.assert_allclose(jax.grad(lambda x: losses.z_loss(x)[0])(logits), 0.0, atol=1e-6)
  shifted, count = losses.z_loss(logits + 2.0)
  np.testing.assert_allclose(shifted / count, 4.0, rtol=1e-5)


def test_z_loss_takes_bfloat16_and_returns_float32():
  total, count = losses.z_loss(_logits().astype(jnp.bfloat16))
  assert total.dtype == count.dtype == jnp.float32


def test_output_logit_stats():
  logits = _logits()
  weights = jnp.array([[1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], jnp.float32)
  stats = losses.output_logit_stats(logits, weights)
  np.testing.assert_allclose(stats["max_logit"], np.max(np.asarray(logits)[0]), rtol=1e-6)
  log_z = jax.nn.logsumexp(logits[0], axis=-1)
  np.testing.assert_allclose(stats["log_z"], jnp.mean(log_z), rtol=1e-5)
  g = jax.grad(lambda x: sum(losses.output_logit_stats(x).values()))(logits)
  np.testing.assert_array_equal(g, 0.0)


def test_output_sums_are_the_sums_of_the_stats():
  """z_sum is z_loss's; log_z_sum / count and max_logit are output_logit_stats'."""
  logits = _logits()
  weights = jnp.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], jnp.float32)
  sums = losses.output_sums(logits, weights)
  z_sum, count = losses.z_loss(logits, weights)
  stats = losses.output_logit_stats(logits, weights)
  np.testing.assert_array_equal(sums["z_sum"], z_sum)
  np.testing.assert_allclose(sums["log_z_sum"] / count, stats["log_z"], rtol=1e-6)
  np.testing.assert_array_equal(sums["max_logit"], stats["max_logit"])
  # Only z_sum carries a gradient: the stats are the logits' health, not a loss.
  np.testing.assert_array_equal(
      jax.grad(lambda x: sum(losses.output_sums(x, weights).values()))(logits),
      jax.grad(lambda x: losses.z_loss(x, weights)[0])(logits))


def test_add_sums_adds_and_takes_the_max_of_max_sums():
  a = {"loss_sum": 1.0, "count": 2.0, "max_logit": 5.0}
  b = {"loss_sum": 3.0, "count": 1.0, "max_logit": 4.0}
  assert losses.add_sums(a, b) == {"loss_sum": 4.0, "count": 3.0, "max_logit": 5.0}
