"""One diagnostics function: eval.json's attention statistics and the trained
study's (`python -m attnscale.studies trained --recompute`) are the same numbers,
for a masked LM with padding as for a char LM.

Tiny train.py runs (test preset, 3 steps). The BERT run trains on the session's
synthetic WikiText (tests/conftest.py); the char LM run needs $ATTNSCALE_DATA.
"""

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnscale import studies, tasks, testing
from attnscale.data import mlm, tokenizer
from attnscale.evaluation import diagnostics, eval_lib
from attnscale.studies import __main__ as cli
from configs import bert_small

# A persistent XLA cache (conftest); strict rank promotion guards the masks' shapes.
pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

STEPS = 3


@pytest.fixture(scope="module")
def bert_run(synthetic_wikitext, tmp_path_factory):
  config = bert_small.get_config("preset=test")
  config.data_dir = synthetic_wikitext[1]
  config.model.vocab_size = mlm.load_wikitext(config.data_dir, splits=()).tokenizer.vocab_size
  run = testing.train_tiny_run(tmp_path_factory, config=config, steps=STEPS, name="bert",
                               evaluate=True)
  return run.config, run.workdir, run.eval


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
  run = testing.train_tiny_run(tmp_path_factory, steps=STEPS, name="char", evaluate=True)
  return run.config, run.workdir, run.eval


def study_csv(workdir, out):
  """The rows `python -m attnscale.studies trained --recompute` writes."""
  cli.main(["trained", "--recompute", "--workdirs", workdir, "--out", str(out)])
  with open(out / "trained.csv") as f:
    return list(csv.DictReader(f))


@pytest.mark.heavy
@pytest.mark.parametrize("run", ["bert_run", "char_run"])
def test_recomputed_study_equals_eval_json(run, request, tmp_path):
  config, workdir, result = request.getfixturevalue(run)
  recomputed = studies.run_diagnostics(workdir, recompute=True)
  assert recomputed.source == "checkpoint" and recomputed.step == STEPS
  # labels.run_label: BERT's post-LN encoder is marked.
  assert recomputed.scaling == result["scaling"] == (
      "standard+post_ln" if run == "bert_run" else "standard")
  assert recomputed.layers == result["attention"]  # the same function, the same floats
  rows = study_csv(workdir, tmp_path)
  assert [int(row["layer"]) for row in rows] == list(range(config.model.num_layers))
  for row, layer in zip(rows, result["attention"]):
    assert row["source"] == "checkpoint"
    for name in ("output_std", "entropy", "max_logit"):
      assert float(row[name]) == pytest.approx(layer[name], rel=1e-5, abs=1e-6)


def test_bert_diagnostics_use_the_padding_mask(bert_run):
  """What the study got wrong before: the padded batch without the task's masks."""
  config, workdir, result = bert_run
  task = tasks.get_task(config)
  model, _, _ = eval_lib.restore(config, workdir)
  first = next(task.eval_batches())
  inputs_BT = jnp.asarray(first["inputs"])
  assert (first["inputs"] == tokenizer.PAD_ID).any()  # there is padding to mask
  mask, query_mask_BT = task.attention_masks(first)
  assert mask.shape == (config.batch_size, 1, 1, config.seq_len)
  assert query_mask_BT.shape == (config.batch_size, config.seq_len)
  masked = diagnostics.model_attention_stats(model, inputs_BT, mask=mask,
                                             query_mask_BT=query_mask_BT)
  assert masked == result["attention"] == diagnostics.task_attention_stats(model, task, first)
  unmasked = diagnostics.model_attention_stats(model, inputs_BT)
  assert not np.allclose([layer["entropy"] for layer in unmasked],
                         [layer["entropy"] for layer in masked])


def test_char_lm_diagnostics_need_no_mask(char_run):
  config, workdir, result = char_run
  task = tasks.get_task(config)
  first = next(task.eval_batches())
  assert task.attention_masks(first) == (None, None)  # causal, no padding
  model, _, _ = eval_lib.restore(config, workdir)
  assert diagnostics.model_attention_stats(model, jnp.asarray(first["inputs"])) == (
      result["attention"])


def test_hidden_state_stats_measure_massive_activations_and_kurtosis():
  """Gaussian states: kurtosis about 3, max/median a few; one planted activation of
  1000 makes the ratio Sun et al.'s 10^3; padded tokens count nowhere."""
  x_BTD = jax.random.normal(jax.random.key(0), (4, 64, 256))
  plain = diagnostics.hidden_state_stats(x_BTD)
  assert float(plain["kurtosis"]) == pytest.approx(3.0, abs=0.1)
  assert 3 < float(plain["act_ratio"]) < 10
  assert float(plain["median_act"]) == pytest.approx(float(jnp.median(jnp.abs(x_BTD))))
  massive = diagnostics.hidden_state_stats(x_BTD.at[0, 5, 7].set(1000.0))
  assert float(massive["max_act"]) == 1000.0 and float(massive["act_ratio"]) > 1000
  # The same outlier on a padded token is not there.
  real_BT = jnp.ones((4, 64), bool).at[0, 5].set(False)
  masked = diagnostics.hidden_state_stats(x_BTD.at[0, 5, 7].set(1000.0), real_BT)
  assert float(masked["max_act"]) < 10
  assert float(masked["median_act"]) == pytest.approx(
      float(jnp.median(jnp.abs(x_BTD)[real_BT])))


def test_sink_heads_is_the_share_of_heads_over_gu_et_al_s_threshold():
  """Two of four heads made to put most weight on key 0 (a large key-0 logit):
  Gu et al.'s sink rate (heads with mean first-key weight > 0.3) is 0.5."""
  kq, kk, kv = jax.random.split(jax.random.key(1), 3)
  q_BTNH = jax.random.normal(kq, (2, 16, 4, 8))
  k_BSKH = jax.random.normal(kk, (2, 16, 4, 8))
  v_BSKH = jax.random.normal(kv, (2, 16, 4, 8))
  # Heads 0 and 1: every query aligned with key 0, which is long.
  k_BSKH = k_BSKH.at[:, 0, :2].set(10.0)
  q_BTNH = q_BTNH.at[:, :, :2].set(1.0)
  stats = diagnostics.attention_stats(q_BTNH, k_BSKH, v_BSKH, is_causal=True)
  assert np.all(np.asarray(stats["heads"]["sink_rate"][:2]) > 0.9)
  assert np.all(np.asarray(stats["heads"]["sink_rate"][2:]) < 0.3)
  assert float(stats["sink_heads"]) == 0.5


def test_top_key_weight_finds_a_sink_wherever_it_sits_and_never_on_padding():
  """Bidirectional, rows of 12 real keys and 4 padded: uniform attention puts 1/12 on
  every key, first or heaviest; a sink planted on key 5 (a [SEP]) in heads 0 and 1
  is the heaviest key there and not the first; padded keys never count, however
  long their keys are."""
  kq, kk, kv = jax.random.split(jax.random.key(2), 3)
  B, T, N, H = 2, 16, 4, 8
  real_BT = jnp.arange(T)[None, :] < 12
  mask = jnp.broadcast_to(real_BT[:, None, None, :], (B, 1, 1, T))
  zeros = jnp.zeros((B, T, N, H))
  v_BSKH = jax.random.normal(kv, (B, T, N, H))
  uniform = diagnostics.attention_stats(zeros, zeros, v_BSKH, mask=mask,
                                        query_mask_BT=real_BT)
  assert float(uniform["top_key_weight"]) == pytest.approx(1 / 12, rel=1e-5)
  assert float(uniform["sink_rate"]) == pytest.approx(1 / 12, rel=1e-5)
  q_BTNH = jax.random.normal(kq, (B, T, N, H)).at[:, :, :2].set(1.0)
  k_BSKH = jax.random.normal(kk, (B, T, N, H)).at[:, 5, :2].set(10.0)
  k_BSKH = k_BSKH.at[:, 14].set(50.0)  # a padded key: masked out, never the heaviest
  stats = diagnostics.attention_stats(q_BTNH, k_BSKH, v_BSKH, mask=mask,
                                      query_mask_BT=real_BT)
  top_N, first_N = (np.asarray(stats["heads"][k]) for k in ("top_key_weight", "sink_rate"))
  assert np.all(top_N[:2] > 0.9) and np.all(first_N[:2] < 0.05)
  assert np.all(top_N[2:] < 0.5)
  assert float(stats["sink_heads"]) == 0.0  # Gu et al.'s first-token count misses it
