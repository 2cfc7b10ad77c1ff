"""Masked LM: rows and padding, masking statistics, padding invariance of every
scaling in the encoder, config checks, and an end-to-end tiny run with resume.

The data comes from the session's synthetic WikiText (tests/conftest.py); the
model tests need no data at all.
"""

import json
import os
import re
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnscale import models, tasks, testing
from attnscale.config import schema
from attnscale.data import mlm, tokenizer
from attnscale.evaluation import eval_lib
from attnscale.models import ModelConfig
from attnscale.runtime import configlib, train_lib
from attnscale.testing import SCALING_CASES
from configs import bert_small

# A persistent XLA cache for this module (conftest): reruns of one config compile once.
pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

V = 60  # vocabulary of the synthetic token tests
RESERVED = len(tokenizer.SPECIALS)


# ---------------------------------------------------------------------------
# Rows: [CLS] ids [SEP] [PAD]..., every id once, padding real.


def toy_rows(seq_len=8):
  lengths = [3, 0, 6, 13, 1]  # paragraph lengths (an empty one is skipped)
  ids = np.arange(100, 100 + sum(lengths), dtype=np.int32)
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  return ids, mlm.make_rows(ids, offsets, seq_len)


def test_rows_cover_every_id_once_in_order_without_crossing_paragraphs():
  ids, rows = toy_rows(seq_len=8)
  assert list(rows.length) == [3, 6, 6, 6, 1, 1]  # 13 = 6 + 6 + 1
  tokens = rows.tokens(np.arange(len(rows)))
  assert tokens.shape == (6, 8) and tokens.dtype == np.int32
  assert (tokens[:, 0] == tokenizer.CLS_ID).all()
  real = tokens >= RESERVED
  np.testing.assert_array_equal(tokens[real], ids)  # row-major: all ids, in order
  for row, n in zip(tokens, rows.length):
    assert row[n + 1] == tokenizer.SEP_ID and (row[n + 2:] == tokenizer.PAD_ID).all()
  assert (tokens == tokenizer.PAD_ID).any()  # padding really occurs
  with pytest.raises(ValueError, match="seq_len must be >= 3"):
    mlm.make_rows(ids, np.array([0, len(ids)]), 2)


# ---------------------------------------------------------------------------
# Masking: 15% of the real tokens, 80/10/10, never a special, uniform.


def random_padded_tokens(rng, G=3000, T=64):
  lengths = rng.integers(1, T - 1, G)
  tokens = rng.integers(RESERVED, V, (G, T)).astype(np.int32)
  j = np.arange(T)[None, :]
  tokens = np.where(j <= lengths[:, None], tokens, tokenizer.PAD_ID)
  tokens[:, 0] = tokenizer.CLS_ID
  tokens[np.arange(G), lengths + 1] = tokenizer.SEP_ID
  return tokens.astype(np.int32), lengths


def test_masking_statistics():
  rng = np.random.default_rng(0)
  tokens, lengths = random_padded_tokens(rng)
  out = mlm.mask_tokens(tokens, np.random.default_rng(1), vocab_size=V)
  pos, w, tgt, inp = out["positions"], out["weights"] > 0, out["targets"], out["inputs"]
  G, P = pos.shape
  assert P == mlm.num_predictions(64, 0.15) == 10
  # Exactly max(1, round(15%)) of each row's real tokens.
  np.testing.assert_array_equal(w.sum(1), np.maximum(1, np.rint(0.15 * lengths)))
  assert w.sum() / lengths.sum() == pytest.approx(0.15, abs=0.01)
  rows = np.repeat(np.arange(G)[:, None], P, 1)
  sel_rows, sel_pos = rows[w], pos[w]
  # Only real tokens, each at most once; targets are the original ids.
  assert (tokens[sel_rows, sel_pos] >= RESERVED).all()
  assert len(set(zip(sel_rows.tolist(), sel_pos.tolist()))) == len(sel_pos)
  np.testing.assert_array_equal(tgt[w], tokens[sel_rows, sel_pos])
  # Everything not selected is unchanged (specials and padding included).
  selected = np.zeros_like(tokens, bool)
  selected[sel_rows, sel_pos] = True
  np.testing.assert_array_equal(inp[~selected], tokens[~selected])
  # 80% [MASK], 10% a random real token, 10% kept.
  new = inp[sel_rows, sel_pos]
  n = len(new)
  masked, kept = new == tokenizer.MASK_ID, new == tgt[w]
  assert masked.mean() == pytest.approx(0.8, abs=0.01)
  random_share = 0.1 * (1 - 1 / (V - RESERVED))  # a random draw may hit the target
  assert (~masked & ~kept).mean() == pytest.approx(random_share, abs=0.01)
  assert kept.mean() == pytest.approx(1 - 0.8 - random_share, abs=0.01)
  assert ((new[~masked] >= RESERVED) & (new[~masked] < V)).all()
  # Uniform over positions: early and late real positions are chosen alike.
  long_rows = lengths >= 40
  early = selected[long_rows, 1:21].mean()
  late = selected[long_rows, 21:41].mean()
  assert early == pytest.approx(late, abs=0.01) and n > 10_000
  # Unused slots point at [CLS] with weight 0 and target [PAD].
  assert (pos[~w] == 0).all() and (tgt[~w] == tokenizer.PAD_ID).all()


def test_masking_rates_are_config():
  tokens, _ = random_padded_tokens(np.random.default_rng(0), G=2000)
  out = mlm.mask_tokens(tokens, np.random.default_rng(1), vocab_size=V, mask_rate=0.3,
                        mask_token_rate=0.0, random_token_rate=0.0)
  w = out["weights"] > 0
  assert w.sum() / (tokens >= RESERVED).sum() == pytest.approx(0.3, abs=0.01)
  np.testing.assert_array_equal(out["inputs"], tokens)  # all "kept"


def test_batches_deterministic_dynamic_and_split_over_processes():
  _, rows = toy_rows(seq_len=8)
  get = lambda **kw: mlm.get_batch(rows, batch_size=4, vocab_size=200,
                                   **{"seed": 0, "step": 3, **kw})
  a, b = get(), get()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert any((get(step=4)[k] != a[k]).any() for k in a)
  assert any((get(seed=1)[k] != a[k]).any() for k in a)
  parts = [get(process_index=p, process_count=2) for p in range(2)]
  for k in a:
    np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), a[k])
  with pytest.raises(ValueError, match="divisible by process_count"):
    get(process_count=3)


def test_each_epoch_is_a_permutation():
  seen = np.concatenate([mlm.epoch_rows(10, 4, seed=0, step=s) for s in range(5)])
  assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
  assert (seen[:10] != seen[10:20]).any()  # reshuffled


def test_eval_batches_fixed_masks_whatever_the_batch_size():
  _, rows = toy_rows(seq_len=8)
  runs = []
  for B in (4, 5):
    batches = list(mlm.eval_batches(rows, batch_size=B, vocab_size=200))
    assert all(b["inputs"].shape == (B, 8) for b in batches)
    flat = {k: np.concatenate([b[k] for b in batches])[:len(rows)] for k in batches[0]}
    fill = {k: np.concatenate([b[k] for b in batches])[len(rows):] for k in batches[0]}
    assert (fill["weights"] == 0).all() and (fill["inputs"] == tokenizer.PAD_ID).all()
    runs.append(flat)
  for k in runs[0]:
    np.testing.assert_array_equal(runs[0][k], runs[1][k])
  np.testing.assert_array_equal(runs[0]["weights"].sum(1),
                                np.maximum(1, np.rint(0.15 * rows.length)))


# ---------------------------------------------------------------------------
# The encoder: padded tokens change nothing for real ones, in every scaling.


def encoder(name, params, *, ln_position="post", variant="standard", head="mlm"):
  cfg = ModelConfig(vocab_size=V, block_size=16, num_layers=2, num_heads=2, width=16,
                    causal=False, scaling=name, scaling_params=params,
                    ln_position=ln_position, head=head, variant=variant)
  return models.build(cfg, rngs=nnx.Rngs(params=0))


MODEL_CASES = (
    [pytest.param(name, params, ln, "standard", "mlm", id=f"{i}-{ln}")
     for i, name, params in SCALING_CASES for ln in ("post", "pre")
     if i != "log_n_per_head"]  # its fixed s has random_qkv's 4 heads, not this model's 2
    + [pytest.param(name, {}, "pre", "unit", "lm", id=f"unit_model-{name}")
       for name in ("fully_scaled", "umup", "key_norm_sum")])


@pytest.mark.parametrize("name, params, ln_position, variant, head", MODEL_CASES)
def test_padding_changes_nothing_for_real_tokens(name, params, ln_position, variant, head):
  model = encoder(name, params, ln_position=ln_position, variant=variant, head=head)
  T, lengths = 16, np.array([9, 16, 4])
  rng = np.random.default_rng(0)
  tokens = rng.integers(RESERVED, V, (3, T)).astype(np.int32)
  real = np.arange(T)[None, :] < lengths[:, None]
  padded = np.where(real, tokens, tokenizer.PAD_ID)
  other = np.where(real, tokens, rng.integers(0, V, (3, T)))  # different "padding"
  mask = jnp.asarray(real)[:, None, None, :]
  logits_a = np.asarray(model(jnp.asarray(padded), mask=mask))
  logits_b = np.asarray(model(jnp.asarray(other), mask=mask))
  np.testing.assert_allclose(logits_a[real], logits_b[real], rtol=0, atol=1e-6)
  # And the same as the unpadded row alone: padded keys are not in any sum or n.
  alone = np.asarray(model(jnp.asarray(tokens[:1, :9])))
  np.testing.assert_allclose(logits_a[0, :9], alone[0], rtol=1e-5, atol=1e-5)


def test_logits_at_positions_are_a_gather():
  model = encoder("standard", {})
  tokens = jnp.asarray(np.random.default_rng(0).integers(RESERVED, V, (2, 16)))
  positions = jnp.asarray([[3, 0, 15], [7, 7, 1]])
  full = model(tokens)
  picked = model(tokens, positions=positions)
  np.testing.assert_allclose(picked, jnp.take_along_axis(full, positions[..., None], 1),
                             atol=1e-6)


@pytest.mark.parametrize("ln_position", ["post", "pre"])
def test_gathered_head_equals_the_full_head_loss_and_gradients(ln_position):
  # The task's loss runs BERT's head on the P selected positions only; projecting
  # all T and picking the P after must give the same loss and the same gradients
  # (the unselected positions get none), padding and unused slots included. (Not
  # the unit-scaled model: unit scaling's backward rules scale the readout's
  # weight gradient by its number of rows, so there the two differ by design.)
  model = encoder("standard", {}, ln_position=ln_position)
  T, lengths = 16, np.array([16, 9, 3])
  rng = np.random.default_rng(1)
  tokens = np.full((3, T), tokenizer.PAD_ID, np.int32)
  for r, n in enumerate(lengths):
    tokens[r, 0], tokens[r, 1:n - 1], tokens[r, n - 1] = (
        tokenizer.CLS_ID, rng.integers(RESERVED, V, n - 2), tokenizer.SEP_ID)
  batch = mlm.mask_tokens(tokens, rng, vocab_size=V, max_predictions=4)
  assert batch["positions"].shape == (3, 4) and batch["weights"][2, 1:].sum() == 0
  batch = {k: jnp.asarray(v) for k, v in batch.items()}

  def gathered(m):
    return tasks.mlm.MLMTask.loss(None, m, batch)[0]

  def full(m):
    total, count = tasks.mlm.full_head_loss(m, batch)
    return total / count

  loss_a, grads_a = nnx.value_and_grad(gathered)(model)
  loss_b, grads_b = nnx.value_and_grad(full)(model)
  np.testing.assert_allclose(loss_a, loss_b, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_max_predictions_per_seq():
  tokens = np.full((4, 32), RESERVED, np.int32)  # 32 real tokens: round(0.15 * 32) = 5
  assert mlm.mask_tokens(tokens, np.random.default_rng(0),
                         vocab_size=V)["positions"].shape == (4, 5)  # ceil(0.15 * 30)
  capped = mlm.mask_tokens(tokens, np.random.default_rng(0), vocab_size=V, max_predictions=3)
  assert capped["positions"].shape == (4, 3) and (capped["weights"].sum(1) == 3).all()
  config = bert_small.get_config("preset=test")
  config.max_predictions_per_seq = 7
  assert tasks.task_class(config).batch_spec(config)["positions"].shape == (8, 7)
  config.max_predictions_per_seq = 31
  with pytest.raises(ValueError, match=re.escape(
      "config.max_predictions_per_seq must be in [1, seq_len - 2 = 30] or None, got 31")):
    configlib.validate(config)


def test_post_ln_blocks_and_mlm_head():
  post, pre = encoder("standard", {}), encoder("standard", {}, ln_position="pre")
  assert hasattr(post, "ln_embed") and hasattr(post, "mlm_head") and not hasattr(post, "ln_f")
  assert hasattr(pre, "ln_f") and not hasattr(pre, "ln_embed")
  # Post-LN: every block's output is LayerNorm-ed (unit RMS per position, no bias).
  x = post.embed_tokens(jnp.arange(16)[None] % V + RESERVED)
  y = post.blocks[0](x)
  np.testing.assert_allclose(jnp.sqrt(jnp.mean(y**2, -1) - jnp.mean(y, -1)**2), 1.0,
                             atol=1e-3)


# ---------------------------------------------------------------------------
# Config: presets validate; bad values give one-line errors naming the field.


def test_presets_validate():
  for preset in bert_small.PRESETS:
    for scaling in ("standard", "unit_scaled"):
      config = bert_small.get_config(f"preset={preset},scaling={scaling}")
      configlib.validate(config)
      schema.model_config(config)
  unit = bert_small.get_config("scaling=unit_scaled").model
  assert (unit.variant, unit.scaling, unit.ln_position, unit.head) == (
      "unit", "fully_scaled", "pre", "lm")
  assert bert_small.get_config("ln=pre").model.ln_position == "pre"


@pytest.mark.parametrize("overrides, message", [
    ({"task": "mlx"}, "config.task must be one of ['char_lm', 'mlm', 'token_lm', 'trigger', "
                      "'mqar', 'max_retrieval'], got 'mlx'"),
    ({"dataset": "wiki"}, "config.dataset must be one of ['wikitext2', 'wikitext2_2k', 'wikitext103']"),
    ({"model.causal": True}, "model.causal must be False for task 'mlm'"),
    ({"mask_rate": 1.5}, "config.mask_rate must be in [0, 1], got 1.5"),
    ({"random_token_rate": 0.3}, "config.mask_token_rate + config.random_token_rate must be"),
])
def test_bad_config_values(overrides, message):
  config = bert_small.get_config("preset=test")
  config.update_from_flattened_dict(overrides)
  with pytest.raises(ValueError, match=re.escape(message)):
    configlib.validate(config)


@pytest.mark.parametrize("overrides, message", [
    ({"model.ln_position": "mid"}, "model.ln_position must be one of ['pre', 'post']"),
    ({"model.head": "cls"}, "model.head must be one of ['lm', 'mlm']"),
    ({"model.variant": "unit", "model.scaling": "fully_scaled"},
     "model.variant='unit' is pre-LN with a tied readout"),
])
def test_bad_model_values(overrides, message):
  config = bert_small.get_config("preset=test")
  config.update_from_flattened_dict(overrides)
  with pytest.raises(ValueError, match=re.escape(message)):
    schema.model_config(config)


def test_bad_config_argument():
  with pytest.raises(ValueError, match=r"ln must be one of \['post', 'pre'\], got 'mid'"):
    bert_small.get_config("ln=mid")
  with pytest.raises(ValueError, match=r"preset must be one of \['mini', 'cpu', 'base', "):
    bert_small.get_config("preset=large")


# ---------------------------------------------------------------------------
# End to end through train.py's train_and_evaluate, on the synthetic corpus.

NUM_STEPS = 20  # the test preset's
STOP_AT = 7


def make_config(data_dir, **overrides):
  config = bert_small.get_config("preset=test")
  config.data_dir = data_dir
  config.model.vocab_size = mlm.load_wikitext(data_dir, splits=()).tokenizer.vocab_size
  config.update_from_flattened_dict(overrides)
  return config


restore = testing.restore_checkpoint


def train_losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {m["step"]: m["train/loss"] for m in map(json.loads, f) if "train/loss" in m}


@pytest.fixture(scope="module")
def run_a(synthetic_wikitext, tmp_path_factory):
  run = testing.train_tiny_run(tmp_path_factory, config=make_config(synthetic_wikitext[1],
                                                                    log_every=1),
                               name="mlm_run_a")
  return run.config, run.workdir, run.metrics


def test_tiny_run_learns_and_eval_json(run_a):
  config, workdir, result = run_a
  ln_vocab = np.log(config.model.vocab_size)
  losses = train_losses(workdir)
  assert sorted(losses) == list(range(1, NUM_STEPS + 1))
  assert losses[1] == pytest.approx(ln_vocab, abs=0.3)
  assert result["loss"] < ln_vocab - 0.5 and result["val_loss"] < ln_vocab - 0.5
  out = eval_lib.evaluate_run(workdir)
  assert set(out) == {"workdir", "step", "scaling", "val_loss", "perplexity", "accuracy",
                      "val_masked_tokens", "attention"}  # no sample: not a causal LM
  assert out["perplexity"] == pytest.approx(np.exp(out["val_loss"]))
  assert 0 < out["accuracy"] < 1 and out["step"] == NUM_STEPS
  # Every masked validation token, once: max(1, round(15%)) of each row's tokens.
  task = tasks.get_task(config)
  assert out["val_masked_tokens"] == int(
      np.maximum(1, np.rint(0.15 * task.val_rows.length)).sum())
  assert len(out["attention"]) == config.model.num_layers
  for layer in out["attention"]:
    assert set(layer) == {"output_std", "entropy", "max_logit", "sink_rate", "sink_heads",
                          "top_key_weight", "uniform_sink_rate", "row_mass", "first_value_norm",
                          "first_value_ratio", "max_act", "median_act", "act_ratio", "kurtosis",
                          "heads"}
    assert all(np.isfinite(v) for k, v in layer.items() if k != "heads")
    assert set(layer["heads"]) == {"entropy", "max_logit", "sink_rate", "top_key_weight",
                                   "row_mass", "first_value_norm", "first_value_ratio"}
    assert all(len(v) == config.model.num_heads for v in layer["heads"].values())
  with open(os.path.join(workdir, "eval.json")) as f:
    assert json.load(f) == json.loads(json.dumps(out))
  assert "perplexity" in eval_lib.format_summary(out)
  # The eval masks are fixed: the same numbers again.
  assert eval_lib.evaluate_run(workdir)["val_loss"] == out["val_loss"]


def test_training_log_holds_sinks_without_padded_keys_and_output_logits(run_a):
  """Every row: the output logits' health (at the masked tokens) and each layer's sinks
  and massive activations; the last row's equal eval.py's diagnostics of the final
  parameters on the last batch's first sink_metrics_rows rows, with the task's masks
  (padded rows: `test_training_sink_stats_keep_padding_out`)."""
  from attnscale.evaluation import diagnostics
  from attnscale.runtime import metric_keys as keys
  from attnscale.runtime import metrics_writer
  config, workdir, _ = run_a
  rows = {r["step"]: r for r in metrics_writer.read_rows(workdir) if keys.LOSS in r}
  layer_keys = [keys.attention_key(prefix, i) for i in range(config.model.num_layers)
                for prefix in (keys.SINK_RATE, keys.SINK_HEADS, keys.MAX_ACT, keys.ACT_RATIO,
                               keys.KURTOSIS, keys.SINK_RATE_HEADS)]
  for row in rows.values():
    assert {keys.OUT_MAX_LOGIT, keys.OUT_LOG_Z, *layer_keys} <= set(row)
    assert keys.Z_LOSS not in row
  task = tasks.get_task(config)
  batch = {k: v[:config.sink_metrics_rows] for k, v in task.train_batch(NUM_STEPS - 1).items()}
  model, _, _ = eval_lib.restore(config, workdir, NUM_STEPS)
  for i, layer in enumerate(diagnostics.task_attention_stats(model, task, batch)):
    row = rows[NUM_STEPS]
    for prefix, name in keys.LAYER_STATS.items():
      np.testing.assert_allclose(row[keys.attention_key(prefix, i)], layer[name],
                                 rtol=1e-4, err_msg=f"{name} {i}")
    np.testing.assert_allclose(row[keys.attention_key(keys.SINK_RATE_HEADS, i)],
                               layer["heads"]["sink_rate"], rtol=1e-4)


def test_training_sink_stats_keep_padding_out():
  """The loop's extra pass (`steps.make_layer_stats`) on padded rows is eval.py's
  `task_attention_stats`, padded keys and queries out, and differs from counting them."""
  from attnscale.evaluation import diagnostics
  from attnscale.runtime import steps
  from attnscale.runtime import train_state as ts
  config = bert_small.get_config("preset=test")
  config.update_from_flattened_dict({"model.vocab_size": V, "sink_metrics_rows": 3})
  mesh = ts.make_mesh(config)
  graphdef, state, _ = ts.create_state(config, mesh)
  task = tasks.MLMTask.without_data(config)
  rng = np.random.default_rng(0)
  inputs = rng.integers(RESERVED, V, (8, config.seq_len)).astype(np.int32)
  for row, length in enumerate([32, 9, 17, 5, 32, 32, 32, 32]):
    inputs[row, length:] = tokenizer.PAD_ID
  batch = {"inputs": inputs}
  got = steps.make_layer_stats(graphdef, task, config, mesh)(state["params"], batch)
  got = diagnostics.as_floats(jax.device_get(got))
  model = nnx.merge(graphdef, state["params"])
  want = diagnostics.task_attention_stats(model, task, {"inputs": inputs[:3]})
  unmasked = diagnostics.model_attention_stats(model, jnp.asarray(inputs[:3]))
  for g, w, u in zip(got, want, unmasked, strict=True):
    for name in ("sink_rate", "sink_heads", "top_key_weight", "max_act", "act_ratio",
                 "kurtosis"):
      np.testing.assert_allclose(g[name], w[name], rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(g["heads"]["sink_rate"], w["heads"]["sink_rate"], rtol=1e-5)
    assert abs(g["sink_rate"] - u["sink_rate"]) > 1e-4  # padding would count otherwise


@pytest.mark.slow
def test_stop_and_resume_equals_uninterrupted_run(run_a, tmp_path, monkeypatch):
  config, workdir_a, _ = run_a
  workdir_b = str(tmp_path / "run_b")
  train_batch = tasks.MLMTask.train_batch

  def train_batch_then_preempt(self, step):
    if step == STOP_AT - 1:  # SIGTERM as a cluster sends it; the loop saves and returns
      assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
      os.kill(os.getpid(), signal.SIGTERM)
    return train_batch(self, step)

  with monkeypatch.context() as m:
    m.setattr(tasks.MLMTask, "train_batch", train_batch_then_preempt)
    assert train_lib.train_and_evaluate(config, workdir_b)["step"] == STOP_AT
  assert train_lib.train_and_evaluate(config, workdir_b)["step"] == NUM_STEPS
  a, b = restore(config, workdir_a), restore(config, workdir_b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  assert train_losses(workdir_b) == train_losses(workdir_a)


def test_bad_value_fails_before_touching_the_workdir(synthetic_wikitext, tmp_path):
  config = make_config(synthetic_wikitext[1], mask_rate=2.0)
  with pytest.raises(ValueError, match="config.mask_rate must be in"):
    train_lib.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
  config = make_config(synthetic_wikitext[1])
  config.model.vocab_size += 1
  with pytest.raises(ValueError, match="model.vocab_size .* must equal the tokenizer's"):
    train_lib.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
