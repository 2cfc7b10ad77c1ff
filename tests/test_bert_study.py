"""The BERT study (attnscale/studies/bert.py) on synthetic sweeps with known answers."""

import csv
import json
import os

import pytest

from attnscale.studies import __main__ as studies_main
from attnscale.studies import bert

STEPS = 100


def _run(workdir, name, *, scaling, lr, seed, train, val, acc, ln="post", variant="standard",
         commit="a" * 40):
  """A finished run directory as train.py and eval.py leave it (no weights)."""
  run = os.path.join(workdir, name)
  os.makedirs(os.path.join(run, "checkpoints", str(STEPS)))
  with open(os.path.join(run, "config.json"), "w") as f:
    json.dump({"learning_rate": lr, "seed": seed, "num_train_steps": STEPS, "task": "mlm",
               "model": {"scaling": scaling, "variant": variant, "ln_position": ln,
                         "unit": {"attn_residual": "relative"}}}, f)
  with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": STEPS, "train/loss": train, "train/loss_last20": train,
                        "train/elapsed_s": 1.0, "train/attn/max_logit/layer_0": 5.0}) + "\n")
  with open(os.path.join(run, "provenance.json"), "w") as f:
    json.dump({"commit": commit, "dirty": False}, f)
  attention = [{"entropy": 2.0 + i, "max_logit": 4.0 * (i + 1), "sink_rate": 0.0,
                "output_std": 1.0} for i in range(2)]
  with open(os.path.join(run, "eval.json"), "w") as f:
    json.dump({"step": STEPS, "val_loss": val, "accuracy": acc, "attention": attention}, f)


# label -> (config scaling, ln, variant, best exponent, per-seed (train, val, acc) offsets)
LABELS = {
    "standard": ("standard", "post", "standard", 8, 0.0),
    "standard_pre": ("standard", "pre", "standard", 8, 0.001),  # within noise of standard
    "fully_scaled": ("fully_scaled", "post", "standard", 8, 0.3),  # clearly worse
    "unit_scaled": ("fully_scaled", "pre", "unit", 5, -0.1),  # clearly better
}
SEED_NOISE = (0.0, 0.02, -0.01)


def _sweep(workdir, commit_of=lambda label, seed: "a" * 40):
  for label, (scaling, ln, variant, e, offset) in LABELS.items():
    for exponent, seeds in ((e, (0, 1, 2)), (e + 1, (0,))):
      for seed in seeds:
        worse = 0.5 if exponent != e else 0.0
        loss = 3.0 + offset + SEED_NOISE[seed] + worse
        _run(workdir, f"{label}-{exponent}-{seed}", scaling=scaling, lr=2.0**-exponent,
             seed=seed, train=loss, val=loss + 0.1, acc=0.4 - offset / 10 - worse / 10,
             ln=ln, variant=variant, commit=commit_of(label, seed))


def _char_results(path):
  rows = []
  for label, offset in (("standard", 0.0), ("fully_scaled", 0.1), ("unit_scaled", -0.2)):
    for seed in (0, 1, 2):
      rows.append({"scaling": label, "variant": "standard", "learning_rate": 2.0**-9,
                   "seed": seed, "steps": 10, "final_train_loss": 2.0 + offset + SEED_NOISE[seed],
                   "best_val_loss": 2.1, "wall_s": 1, "status": "done", "run": f"{label}{seed}"})
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, rows[0].keys())
    writer.writeheader()
    writer.writerows(rows)


def test_labels_and_best_rates(tmp_path):
  _sweep(tmp_path)
  rows = bert.read_rows(str(tmp_path))
  assert {r["scaling"] for r in rows} == set(LABELS)
  best = bert.at_best(rows, str(tmp_path), evaluate=False)
  assert {k: (b["learning_rate"], b["seeds"]) for k, b in best.items()} == {
      k: (2.0**-v[3], 3) for k, v in LABELS.items()}
  assert all(len(b["runs"]) == 3 and "val_loss" in b["runs"][0] for b in best.values())


def test_study_writes_its_tables_with_the_known_verdicts(tmp_path):
  workdir, out = tmp_path / "sweep", tmp_path / "out"
  _sweep(workdir)
  _char_results(tmp_path / "char.csv")
  studies_main.main(["bert", "--out", str(out), "--workdirs", str(workdir), "--no_eval",
                     "--char_results", str(tmp_path / "char.csv")])
  for name in ("bert.md", "bert_claims.md", "bert_vs_char.md", "bert_attention.md", "bert.png",
               "runs.csv", "sweep/results.md"):
    assert (out / name).exists(), name
  with open(out / "bert_claims.csv") as f:
    claims = {(r["comparison"], r["metric"]): r for r in csv.DictReader(f)}
  # Every seed shifts alike: paired differences are exact, verdicts sure.
  fs = claims[("fully_scaled - standard", "validation MLM loss")]
  assert float(fs["effect"]) == pytest.approx(0.3) and fs["verdict"] == "worse"
  assert claims[("fully_scaled - standard", "masked-token accuracy")]["verdict"] == "worse"
  assert claims[("unit_scaled - fully_scaled", "validation MLM loss")]["verdict"] == "better"
  assert float(claims[("unit_scaled - standard", "masked-token accuracy")]["effect"]) == (
      pytest.approx(1.0))  # points: 0.01 accuracy
  with open(out / "bert_vs_char.csv") as f:
    ranking = {r["label"]: r for r in csv.DictReader(f)}
  assert set(ranking) == {"standard", "fully_scaled", "unit_scaled"}  # standard_pre: BERT only
  assert [ranking[k]["bert_rank"] for k in ("unit_scaled", "standard", "fully_scaled")] == [
      "1", "2", "3"]
  assert ranking["fully_scaled"]["agree"] == "yes"
  with open(out / "bert.csv") as f:
    table = {r["label"]: r for r in csv.DictReader(f)}
  # One tied rate each (the others ran one seed): the robust verdict is the paired one.
  assert table["fully_scaled"]["val_robust"] == "worse"
  assert table["standard"]["val_robust"] == "baseline" and table["standard"]["ties"]
  with open(out / "runs.csv") as f:
    runs = list(csv.DictReader(f))
  assert len(runs) == 16 and {r["commit"] for r in runs} == {"a" * 40}
  assert set(runs[0]) >= {"label", "learning_rate", "seed", "val_loss", "accuracy", "commit"}
  assert "Kendall's tau between the two rankings: +1.00" in (out / "bert_vs_char.md").read_text()
  with open(out / "bert_attention.csv") as f:
    assert len(list(csv.DictReader(f))) == 2 * len(LABELS)


def test_mixed_commits_need_the_flag(tmp_path):
  workdir = tmp_path / "sweep"
  _sweep(workdir, commit_of=lambda label, seed: ("b" if seed == 2 else "a") * 40)
  argv = ["bert", "--out", str(tmp_path / "out"), "--workdirs", str(workdir), "--no_eval"]
  with pytest.raises(SystemExit, match="bert: runs from 2 commits.*--allow_mixed_code"):
    studies_main.main(argv)
  studies_main.main(argv + ["--allow_mixed_code"])
  assert "runs from 2 commits" in (tmp_path / "out" / "bert.md").read_text()


def test_a_run_archived_without_weights_or_eval_is_reported_not_fatal(tmp_path):
  """run_records.archive keeps no weights: a run archived before eval.py ran cannot be
  evaluated later; the study says so and reads its other seeds."""
  import shutil
  _sweep(tmp_path)
  run = tmp_path / "standard-8-0"
  (run / "eval.json").unlink()
  shutil.rmtree(run / "checkpoints")
  (run / "checkpoints").mkdir()  # as orbax leaves it: the folder, no step
  (run / "archived.json").write_text(json.dumps({"step": STEPS}))  # run_records.archive's mark
  rows = bert.read_rows(str(tmp_path))
  best = bert.at_best(rows, str(tmp_path), evaluate=True)  # would need the weights
  assert best["standard"]["unevaluated"] == ["standard-8-0"]
  assert sorted(bert._by_seed(best["standard"], "val_loss")) == [1, 2]
  table = {r["label"]: r for r in bert.label_rows(best)}
  assert table["standard"]["seeds"] == 3 and table["standard"]["val_seeds"] == 2
  # Accuracy against standard, in points: higher is better (compare's "worse").
  assert table["unit_scaled"]["acc_vs_standard"].endswith(": better")
  assert table["fully_scaled"]["acc_vs_standard"].endswith(": worse")
