"""The normalisers study (attnscale/studies/normalisers.py) on synthetic sweeps: run
directories as train.py and eval.py leave them (testing.fake_run plus an eval.json),
no training. Every label's loss is softmax's plus a fixed offset on every seed, with
a seed noise of +-0.1 that all labels share: paired by seed the offsets come out
exactly, where an unpaired test would call them noise."""

import json
import math
import os

import pytest

from attnscale import testing
from attnscale.config import labels
from attnscale.experiments import results_store, stats
from attnscale.studies import __main__ as cli
from attnscale.studies import normalisers, normalisers_runs
from configs import bert_small, bert_small_sweeps, shakespeare_char
from configs import shakespeare_char_sweeps as sweep_configs

STEPS = shakespeare_char.get_config("preset=test").num_train_steps
LENGTHS = (64, 128, 256, 512, 1024)
BEST = 8  # every label's best exponent
NOISE = (0.0, 0.1, -0.1)  # by seed, shared by every label
# label -> (loss offset from softmax, sink rate, act_ratio, kurtosis, loss growth per
# doubling of the length); softmax: (0, 0.3, 50, 20, 0.5).
SOFTMAX = (0.0, 0.3, 50.0, 20.0, 0.5)
EFFECTS = {"gate_headwise": (0.0, 0.05, 10.0, 5.0, 0.5),   # no cost, no sinks
           "softpick": (0.05, 0.01, 60.0, 5.0, 0.5),       # costs 0.05; act_ratio up
           "stickbreaking": (0.0, 0.3, 50.0, 20.0, 0.1),   # extrapolates
           "fox": (0.0, 0.3, 50.0, 20.0, 0.5)}             # does not


def _run(root, label, e, seed, *, loss=None, evaluated=True):
  """One finished run of `label` at 2^-e (NaN loss: diverged), evaluated unless not."""
  scaling, overrides = sweep_configs.NORMALISERS[label]
  offset, sink, act, kurt, growth = EFFECTS.get(label, SOFTMAX)
  if loss is None:
    loss = 2.0 + offset + 0.02 * (e - BEST) ** 2 + NOISE[seed]
  records = [{"step": STEPS, "train/loss": loss, "train/loss_last20": loss}]
  run = testing.fake_run(root, f"{label}-{e}-{seed}", f"preset=test,scaling={scaling},"
                         f"seed={seed}", {"learning_rate": 2.0**-e, **overrides, "label": label}, records,
                         done=math.isfinite(loss))
  with open(os.path.join(run, "provenance.json"), "w") as f:
    json.dump([{"commit": "abc1234", "dirty": False}], f)
  if evaluated and math.isfinite(loss):
    layer = {"sink_rate": sink, "sink_heads": sink, "act_ratio": act, "kurtosis": kurt,
             "max_logit": 10.0, "entropy": 1.0, "heads": {"sink_rate": [sink, sink / 3]}}
    val = loss + 0.1
    result = {"step": STEPS, "val_loss": val,
              "attention": [layer, dict(layer, sink_rate=sink / 2, act_ratio=act / 2)],
              "lengths": {str(L): {"val_loss": val + growth * math.log2(L / 64)}
                          for L in LENGTHS}}
    with open(os.path.join(run, "eval.json"), "w") as f:
      json.dump(result, f)


def _label(root, label, seeds_at_best=(0, 1, 2), window=range(BEST - 2, BEST + 3)):
  for e in window:
    _run(root, label, e, 0)
  for seed in seeds_at_best:
    if seed:
      _run(root, label, BEST, seed)


@pytest.fixture(scope="module")
def full(tmp_path_factory):
  """Every label: seed 0 over the window, seeds 1 and 2 at the best; softmax also has a
  diverged run far from the window (e = 3), which S must leave out."""
  root = tmp_path_factory.mktemp("normalisers_full")
  for label in sweep_configs.NORMALISERS:
    _label(root, label)
  _run(root, "softmax", 3, 0, loss=math.nan)
  out = root / "out"
  cli.main(["normalisers", "--out", str(out), "--workdirs", str(root)])
  return root, out


def _csv(path) -> dict[str, dict]:
  import csv
  with open(path) as f:
    return list(csv.DictReader(f))


def test_the_labels_are_the_sweeps_own():
  """The study's labels are the sweep's declarations (not restated): in the tables'
  order, the softmax family then each normaliser beside its twin; a run reads its
  declared label, one made by hand its attention setup."""
  assert list(normalisers_runs.LABELS) == normalisers_runs.order(sweep_configs.NORMALISERS)
  assert set(normalisers_runs.LABELS) == set(sweep_configs.NORMALISERS)
  assert normalisers_runs.BERT_LABELS == tuple(bert_small_sweeps.BERT_NORMALISERS)
  config = shakespeare_char.get_config("preset=graphcore_cpu,scaling=standard,seed=0")
  assert labels.of(config.to_dict()) == "standard"
  config.label = "softmax"
  assert labels.of(config.to_dict()) == "softmax"


def test_the_full_store_gives_every_table_in_order(full):
  _, out = full
  for name in ("normalisers", "normalisers_claims", "normalisers_layers",
               "normalisers_lengths"):
    assert (out / f"{name}.csv").exists() and (out / f"{name}.md").exists()
  for name in ("normalisers", "normalisers_sinks", "normalisers_lengths"):
    assert (out / f"{name}.png").stat().st_size > 0
  table = {r["label"]: r for r in _csv(out / "normalisers.csv")}
  assert list(table) == list(normalisers_runs.LABELS)  # softmax family, then each twin beside
  assert list(table)[8:10] == ["sigmoid", "sigmoid_qk_rmsnorm"]
  softmax, softpick = table["softmax"], table["softpick"]
  assert softmax["best_lr"] == str(2.0**-BEST) and softmax["seeds"] == "3"
  assert softmax["val_vs_softmax"] == "reference"
  # Paired: exactly +0.05 on every seed; the shared +-0.1 noise cancels.
  assert softpick["val_vs_softmax"] == "+0.050 [+0.050, +0.050] paired n=3: worse"
  # S over the two-octave window of seed 0 (the diverged e = 3 is outside it).
  assert float(softmax["S"]) == pytest.approx(0.02 * (4 + 1 + 0 + 1 + 4) / 5)
  assert softmax["S_rates"] == "5"
  assert float(softmax["sink_rate"]) == pytest.approx(0.225)
  assert float(softmax["sink_rate_max"]) == pytest.approx(0.3)
  assert float(softmax["act_ratio"]) == pytest.approx(50.0)
  assert float(table["stickbreaking"]["loss@1024"]) == pytest.approx(2.1 + 0.4)
  layers = _csv(out / "normalisers_layers.csv")
  assert len(layers) == 2 * 16 and float(layers[1]["sink_rate"]) == pytest.approx(0.15)
  lengths = {r["label"]: r for r in _csv(out / "normalisers_lengths.csv")}
  assert lengths["softmax"]["L=1024 - L=64"] == "+2.000 [+2.000, +2.000]"
  runs = _csv(out / "runs.csv")
  assert len(runs) == 16 * 7 + 1 and "val_loss_L1024" in runs[0]


def test_the_claims_are_read_from_paired_intervals(full):
  _, out = full
  claims = {(r["label"], r["measure"]): r for r in _csv(out / "normalisers_claims.csv")}
  gate = claims["gate_headwise", "val_loss"]
  assert gate["verdict"] == "consistent (within noise)" and gate["seeds"] == "3"
  assert claims["gate_headwise", "sink_rate (mean over layers)"]["verdict"] == "holds (lower)"
  assert claims["softpick", "val_loss"]["verdict"] == "contradicted (higher)"
  assert claims["softpick", "act_ratio (largest layer)"]["verdict"] == "contradicted (higher)"
  assert claims["softpick", "kurtosis (largest layer)"]["verdict"] == "holds (lower)"
  assert claims["stickbreaking", "loss@1024 - loss@64"]["verdict"] == "holds (lower)"
  assert claims["fox", "loss@1024 - loss@64"]["verdict"] == "not shown (within noise)"
  assert claims["relu_qk_rmsnorm", "val_loss"]["verdict"] == "consistent (within noise)"
  # Every claim's every label and measure has its row
  # (but the heaviest key's weight, which these runs' eval.json predates).
  assert len(claims) == sum(len(c.labels) * len([m for m, _ in c.predicts
                                                 if m != "top_key_weight"])
                            for c in normalisers.CLAIMS)


def test_a_partial_store_shows_seed_counts_and_pending_claims(tmp_path):
  """softmax has seeds 0 and 1 at its best, softpick all three; relu is at stage 1
  (seed 0, three rates, one not evaluated yet); every sigmoid run diverged;
  gate_headwise has not started."""
  _label(tmp_path, "softmax", seeds_at_best=(0, 1))
  _label(tmp_path, "softpick")
  for e in (BEST - 1, BEST, BEST + 1):
    _run(tmp_path, "relu", e, 0, evaluated=e != BEST + 1)
  for e in (BEST - 1, BEST):
    _run(tmp_path, "sigmoid", e, 0, loss=math.nan)
  out = tmp_path / "out"
  cli.main(["normalisers", "--out", str(out), "--workdirs", str(tmp_path)])
  table = {r["label"]: r for r in _csv(out / "normalisers.csv")}
  assert list(table) == ["softmax", "sigmoid", "softpick", "relu"]
  assert table["softmax"]["seeds"] == "2" and table["relu"]["seeds"] == "1"
  # Paired on the two shared seeds only; softpick's seed 2 is left out.
  assert table["softpick"]["val_vs_softmax"] == (
      "+0.050 [+0.050, +0.050] paired n=2 (1 unpaired left out): worse")
  assert table["sigmoid"]["seeds"] == "0" and table["sigmoid"]["best_lr"] == "nan"
  assert table["sigmoid"]["S"] == "nan" and table["sigmoid"]["val_vs_softmax"] == ""
  assert table["relu"]["S_rates"] == "3"
  claims = {(r["label"], r["measure"]): r for r in _csv(out / "normalisers_claims.csv")}
  assert claims["softpick", "val_loss"]["verdict"] == "pending (2 seeds)"
  assert claims["relu", "val_loss"]["verdict"] == "pending (1 seed)"
  gate = claims["gate_headwise", "val_loss"]
  assert gate["verdict"] == "pending (0 seeds)" and gate["difference"] == ""
  md = (out / "normalisers.md").read_text()
  assert "Not in the store yet: sink_learned, sink_zero, gate_headwise" in md
  assert "softmax (2), relu (1)" in md
  lengths = {r["label"]: r for r in _csv(out / "normalisers_lengths.csv")}
  assert set(lengths) == {"softmax", "softpick", "relu"}


def test_verdicts():
  def compared(lo, hi):
    return stats.Comparison((lo + hi) / 2, lo, hi, 2, 3, "paired",
                            "better" if hi < 0 else "worse" if lo > 0 else "within noise")
  assert normalisers.verdict(compared(-0.2, -0.1), "lower", 3) == "holds (lower)"
  assert normalisers.verdict(compared(0.1, 0.2), "no worse", 3) == "contradicted (higher)"
  assert normalisers.verdict(compared(-0.1, 0.1), "no worse", 3) == "consistent (within noise)"
  assert normalisers.verdict(compared(-0.1, 0.1), "lower", 3) == "not shown (within noise)"
  assert normalisers.verdict(compared(-0.2, -0.1), "lower", 2) == "pending (2 seeds)"


def test_no_runs_is_a_one_line_error(tmp_path):
  with pytest.raises(SystemExit, match="no finished runs"):
    cli.main(["normalisers", "--out", str(tmp_path / "out"), "--workdirs", str(tmp_path)])


def test_uniform_first_key_weight():
  # Causal at T = 4: queries 1, 2, 3 see 2, 3, 4 keys.
  assert normalisers.uniform_first_key(4) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
  assert normalisers.uniform_first_key(64, causal=False) == 1 / 64


def test_sink_runs_give_a_per_layer_table(full, tmp_path):
  """--sink_runs: any evaluated runs (the sink hunt's), one row a layer, beside the
  uniform weight; runs without an eval.json are left out."""
  hunt = tmp_path / "hunt"
  _run(hunt, "softmax", BEST, 0)
  _run(hunt, "softmax", BEST, 1, evaluated=False)
  out = tmp_path / "out"
  root, _ = full
  cli.main(["normalisers", "--out", str(out), "--workdirs", str(root),
            "--sink_runs", str(hunt)])
  rows = normalisers.sink_hunt_rows([str(hunt)])
  assert [(r["run"], r["layer"]) for r in rows] == [("softmax-8-0", 0), ("softmax-8-0", 1)]
  assert [r["sink_rate"] for r in rows] == [0.3, 0.15]
  assert [r["sink_rate_max_head"] for r in rows] == [0.3, 0.3]
  T = shakespeare_char.get_config("preset=test").seq_len
  assert rows[0]["uniform"] == pytest.approx(normalisers.uniform_first_key(T))
  assert "softmax-8-0" in (out / "normalisers_sink_hunt.md").read_text()


def _bert_run(root, label, e, seed, accuracy):
  """One finished, evaluated run of the small BERT's `label` at 2^-e (the cpu preset,
  RoPE, as the sweep's): softmax's loss
  and sinks, and the masked-token `accuracy`."""
  scaling, overrides = bert_small_sweeps.BERT_NORMALISERS[label]
  steps = bert_small.get_config("preset=cpu").num_train_steps
  loss = 4.0 + 0.02 * (e - BEST) ** 2 + NOISE[seed]
  run = testing.fake_run(root, f"{label}-{e}-{seed}", f"preset=cpu,scaling={scaling},"
                         f"seed={seed}", {"learning_rate": 2.0**-e, **overrides, "label": label},
                         [{"step": steps, "train/loss": loss, "train/loss_last20": loss}],
                         config_module=bert_small)
  top = 0.5 if label == "softmax" else 0.1  # a [SEP] sink that the others remove
  layer = {"sink_rate": 0.2, "top_key_weight": top, "sink_heads": 0.0, "act_ratio": 9.0,
           "kurtosis": 3.0, "max_logit": 5.0, "entropy": 2.0,
           "heads": {"sink_rate": [0.2, 0.2], "top_key_weight": [top, top]}}
  with open(os.path.join(run, "eval.json"), "w") as f:
    json.dump({"step": steps, "val_loss": loss + 0.1, "accuracy": accuracy,
               "attention": [layer, layer]}, f)


def test_bert_runs_give_the_same_tables_for_the_bert(full, tmp_path):
  """--bert_runs: the bert_normalisers sweep's labels, read back from the BERT's
  (post-LN) configs, with masked-token accuracy (higher is better) and only the
  claims that need no causal order."""
  assert normalisers_runs.BERT_LABELS == tuple(bert_small_sweeps.BERT_NORMALISERS)
  bert = tmp_path / "bert"
  for i, label in enumerate(normalisers_runs.BERT_LABELS):
    for e in (BEST - 1, BEST, BEST + 1):
      _bert_run(bert, label, e, 0, accuracy=0.30 + 0.01 * i)
    for seed in (1, 2):
      _bert_run(bert, label, BEST, seed, accuracy=0.30 + 0.01 * i + 0.001 * seed)
  root, _ = full
  out = tmp_path / "out"
  store = str(tmp_path / "bert_runs.parquet")  # as the sweep's --archive_to leaves them
  results_store.archive(str(bert), store)
  cli.main(["normalisers", "--out", str(out), "--workdirs", str(root),
            "--bert_runs", store])
  table = {r["label"]: r for r in _csv(out / "normalisers_bert.csv")}
  assert list(table) == list(normalisers_runs.BERT_LABELS)
  assert table["softmax"]["best_lr"] == str(2.0**-BEST) and table["relu"]["seeds"] == "3"
  assert table["softmax"]["accuracy_pct"] == "30.10 [29.85, 30.35]"
  assert table["relu"]["acc_vs_softmax"] == "+3.000 [+3.000, +3.000] paired n=3: better"
  assert table["softpick"]["val_vs_softmax"].endswith("within noise")
  assert "loss@1024" not in table["softmax"]
  assert float(table["softmax"]["top_key_weight"]) == pytest.approx(0.5)
  claims = _csv(out / "normalisers_bert_claims.csv")
  assert {r["label"] for r in claims} == {"gate_elementwise", "softpick", "relu"}
  top = {r["label"]: r for r in claims if r["measure"].startswith("top_key_weight")}
  assert top["softpick"]["verdict"] == "holds (lower)" and set(top) == {"gate_elementwise",
                                                                          "softpick"}
  assert all(r["seeds"] == "3" for r in claims)
  assert len(_csv(out / "normalisers_bert_layers.csv")) == 4 * 2
  for name in ("normalisers_bert", "normalisers_bert_sinks"):
    assert (out / f"{name}.png").stat().st_size > 0
  assert len(_csv(out / "normalisers_bert_runs.csv")) == 4 * 5
  assert "bidirectional" in (out / "normalisers_bert.md").read_text()
