"""The scale studies: published numbers within stated tolerances, CLI, notebook.

Sizes are small so the whole file runs in well under a minute; every study is
seeded, so the measured values (and tolerances) are deterministic.
"""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from attnscale import studies, testing
from attnscale.studies import __main__ as cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "scale_studies.ipynb")


def _scalings(*names):
  return {name: studies.default_scalings()[name] for name in names}


# Graphcore's setting at n = 256, d = 64; causal sequences of 64.
OUTPUT_SCALE_ARGS = dict(n_values=(256,), d=64, queries=64, batch=4, heads=8, causal_len=64,
                         causal_batch=8, scale_fns=_scalings("standard", "fully_scaled"), seed=0)


@pytest.fixture(scope="module")
def output_scale():
  return studies.output_scale(**OUTPUT_SCALE_ARGS)


def test_graphcore_headline(output_scale):
  # docs/science.md, "Why the standard output shrinks with n": standard about 0.10 (theory sqrt(e/256) = 0.103), fully scaled about 1.0.
  # Measured (seed 0): 0.1014 and 0.984.
  assert abs(output_scale.std["standard"][0] - 0.10) <= 0.01
  assert abs(output_scale.std["fully_scaled"][0] - 1.0) <= 0.1
  assert output_scale.theory("standard", 256) == pytest.approx(math.sqrt(math.e / 256))


def test_causal_per_position_and_pooled(output_scale):
  standard = output_scale.causal_position["standard"]
  fully = output_scale.causal_position["fully_scaled"]
  assert standard.shape == (64,)
  # Position 0 sees one key: z_0 = v_0 exactly, std 1 (4096 samples).
  assert abs(standard[0] - 1) < 0.05 and fully[0] == standard[0]
  # Position 63 (n = 64): Graphcore's sqrt(e/n) = 0.206 within 15% (measured 0.201).
  assert abs(standard[63] / math.sqrt(math.e / 64) - 1) < 0.15
  # Fully scaled: unit scale once n > e (the causal rule max(1, sqrt(n/e))), measured 0.98.
  assert abs(fully[63] - 1) < 0.1
  assert np.all(np.diff(standard[::8]) < 0)  # shrinks with n
  pooled = output_scale.causal_pooled["standard"][0]
  assert standard.min() < pooled < standard.max()
  assert pooled == pytest.approx(output_scale.pooled_theory("standard", 64), rel=0.2)


def test_temperature_sweep_matches_theory_for_t_at_least_1():
  r = studies.temperature_sweep((2.0**-4, 1.0, 2.0, 4.0, 16.0), (256,), d=64, queries=64,
                                batch=4, heads=8)
  rows = {row["t"]: row for row in r.rows()}
  # Theory sqrt(exp(t^-2)/n) within 5% for t >= 1 (measured: 2.5% at most).
  for t in (1.0, 2.0, 4.0, 16.0):
    assert abs(rows[t]["std_over_theory"] - 1) < 0.05, rows[t]
  # t = 1/16: the softmax is nearly one-hot, std near 1, the formula far off.
  assert 0.8 < rows[2.0**-4]["std"] < 1.0 and rows[2.0**-4]["theory"] > 1e50


def test_with_temperature_divides_logits():
  import jax

  import attnscale
  q, k = (jax.random.normal(key, (1, 4, 2, 8)) for key in jax.random.split(jax.random.key(0)))
  base = attnscale.scalings.get("standard")
  hot, _ = attnscale.attention_weights(q, k, scale_fn=studies.with_temperature(base, 2.0))
  ref, _ = attnscale.attention_weights(q, k, scale_fn=base)
  np.testing.assert_allclose(hot, ref / 2, rtol=1e-6)
  with pytest.raises(ValueError, match="temperature must be > 0"):
    studies.with_temperature(base, 0.0)


def _skew(result, d, scaling, quantity="weight"):
  (label,) = [m.label for m in result.methods
              if m.scaling == scaling and m.quantity == quantity and not m.params]
  return studies.summary(result.values[d][label])["skewness"]


@pytest.mark.parametrize("dist", ["normal", "uniform", "nonzero_mean", "unequal_lengths"])
def test_bernhard_sum_of_key_norms_keeps_gaussian_shape(dist):
  # Bernhard 2023's setting: 32 keys drawn once, 500 queries, d = 16 and 256.
  r = studies.key_norms((16, 256), queries=500, keys=32, dist=dist, seed=0)
  for d in (16, 256):
    # Measured |skew| <= 0.14 for the sum of key norms, 0.11 for the raw dot
    # products; 1/sqrt(d) softmax: skew 2.4 ... 3.9 (right-skewed).
    assert abs(_skew(r, d, "key_norm_sum")) < 0.25, (dist, d)
    assert abs(_skew(r, d, "none", "logit")) < 0.25, (dist, d)
    assert _skew(r, d, "standard") > 1.5, (dist, d)
    weights = r.values[d]["softmax(q.k / sum ||k||)"]
    assert weights.mean() == pytest.approx(1 / 32, rel=0.02)  # near uniform, 1/n


def test_key_norms_other_distributions_and_unsaturated_softmax():
  # Same shapes as above (500 queries, 32 keys): no new compilations.
  r = studies.key_norms((256,), queries=500, dist="student_t", df=3.0, seed=1)
  rows = r.rows()
  assert len(rows) == len(studies.DEFAULT_METHODS)
  assert all(np.isfinite([row["mean"], row["sd"], row["skewness"]]).all() for row in rows)
  # Unscaled softmax at d = 256 saturates: weights pile up at 0 (and 1).
  normal = studies.key_norms((256,), queries=500, seed=1)
  x = normal.values[256]["softmax(q.k)"]
  assert np.mean(x < 1e-3) > 0.8 and x.max() > 0.9
  with pytest.raises(ValueError, match="dist must be one of"):
    studies.key_norms((16,), dist="cauchy")


def test_gaussian_kde_and_summary():
  x = np.random.default_rng(0).normal(size=4000)
  grid = np.linspace(-6, 6, 1201)
  density = studies.gaussian_kde(x, grid)
  assert np.sum(density) * (grid[1] - grid[0]) == pytest.approx(1.0, abs=1e-3)
  # Its expectation is N(0, 1) smoothed by the kernel: N(0, 1 + h^2).
  var = 1 + studies.silverman_bandwidth(x)**2
  np.testing.assert_allclose(density, np.exp(-grid**2 / (2 * var)) / np.sqrt(2 * np.pi * var),
                             atol=0.03)
  h = 0.9 * min(x.std(), np.subtract(*np.percentile(x, [75, 25])) / 1.34) * 4000**-0.2
  assert studies.silverman_bandwidth(x) == pytest.approx(h)
  exp = np.random.default_rng(0).exponential(size=200_000)  # skewness 2, excess kurtosis 6
  s = studies.summary(exp)
  assert s["skewness"] == pytest.approx(2, abs=0.1)
  assert s["excess_kurtosis"] == pytest.approx(6, abs=0.6)


def test_tables_format():
  rows = [{"name": "a", "x": 0.123456789, "n": 3, "opt": None}]
  assert studies.to_csv(rows) == "name,x,n,opt\na,0.123457,3,\n"
  assert studies.to_markdown(rows).splitlines()[1] == "|---|---:|---:|---:|"
  assert studies.to_markdown([{"method": "q.k / sum ||k||"}]).splitlines()[2] == (
      r"| q.k / sum \|\|k\|\| |")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
  """A tiny train.py run (test preset, 5 steps) evaluated by eval.py's
  `evaluate_run`, so it has both a checkpoint and an eval.json."""
  return testing.train_tiny_run(tmp_path_factory, "preset=test,scaling=key_norm_sum", steps=5,
                                name="key_norm_sum", evaluate=True).workdir


def test_trained_diagnostics_from_eval_json_and_checkpoint(trained_run):
  from_json = studies.run_diagnostics(trained_run)
  assert (from_json.scaling, from_json.step, from_json.source) == ("key_norm_sum", 5, "eval.json")
  assert len(from_json.layers) == 2  # test preset: 2 layers
  # From the checkpoint, the study computes exactly what eval.py wrote.
  from_checkpoint = studies.run_diagnostics(trained_run, recompute=True)
  assert from_checkpoint.source == "checkpoint" and from_checkpoint.layers == from_json.layers
  r = studies.TrainedResult([from_json, from_checkpoint])
  rows = r.rows()
  assert [(row["layer"], row["source"]) for row in rows] == [
      (0, "eval.json"), (1, "eval.json"), (0, "checkpoint"), (1, "checkpoint")]
  for row in rows:
    assert row["run"] == f"key_norm_sum ({os.path.basename(trained_run)})"
    assert np.isfinite([row["output_std"], row["entropy"], row["max_logit"]]).all()
    # key_norm_sum near init: logits about 1/n, weights nearly uniform, so the
    # entropy is close to its maximum (log n averaged over causal positions).
    assert 0 < row["max_logit"] < 0.5
  # Per head: 2 layers x 2 heads per run; key_norm_sum's near-uniform weights put
  # about the mean 1/n_i on the first key.
  heads = r.head_rows()
  assert len(heads) == 2 * 2 * 2 and {h["head"] for h in heads} == {0, 1}
  assert all(0 < h["sink_rate"] < 0.5 for h in heads)
  # Per run, over its layers and heads.
  summary = r.summary_rows()
  assert [row["run"] for row in summary] == [rows[0]["run"]] * 2
  assert summary[0]["max_logit"] == max(h["max_logit"] for h in heads[:4])
  assert summary[0]["sink_rate_mean"] == pytest.approx(np.mean([h["sink_rate"] for h in heads[:4]]))
  assert summary[0]["entropy_min"] == min(h["entropy"] for h in heads[:4])
  fig = studies.plot_trained(r)
  assert len(fig.axes) == 4
  with pytest.raises(ValueError, match="at least one workdir"):
    studies.trained_diagnostics([])


def _cli(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "attnscale.studies", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, check=True).stdout


STUDY_FILES = ("output_scale", "temperature", "key_norms")
# The shapes the tests above compile already, so the in-process run is cheap.
TINY = ["--min-n", "256", "--max-n", "256", "--causal-len", "64", "--batch", "4", "--heads", "8",
        "--queries-per-sequence", "64", "--temperature-n", "256",
        "--scalings", "standard", "fully_scaled", "--dims", "16", "--queries", "500",
        "--keys", "32"]


def test_cli_writes_figures_and_tables_deterministically(tmp_path, capsys):
  out = tmp_path / "a"
  cli.main(["all", "--out", str(out), *TINY])
  assert "Headline (bidirectional, n = 256): standard 0.1014" in capsys.readouterr().out
  for name in STUDY_FILES:
    for ext in ("png", "csv", "md"):
      assert (out / f"{name}.{ext}").stat().st_size > 0, (name, ext)
  header = (out / "output_scale.csv").read_text().splitlines()[0]
  assert header == "scaling,mode,n,std,theory,logit_std"
  assert "| d | method | scaling | mean | sd | skewness | excess_kurtosis |" in (
      out / "key_norms.md").read_text()
  # Seeded: the same command, from the command line, writes the same table and figure.
  _cli("key_norms", "--out", str(tmp_path / "b"), *TINY)
  for ext in ("csv", "md", "png"):
    assert (out / f"key_norms.{ext}").read_bytes() == (
        tmp_path / "b" / f"key_norms.{ext}").read_bytes(), ext


def test_output_scale_is_deterministic(output_scale):
  again = studies.output_scale(**OUTPUT_SCALE_ARGS)  # compiled already: cheap
  assert studies.to_csv(again.rows()) == studies.to_csv(output_scale.rows())


def test_cli_rejects_bad_arguments(capsys):
  with pytest.raises(SystemExit):
    cli.main(["output_scale", "--out", "unused", "--max-n", "100"])
  assert "must be a power of 2" in capsys.readouterr().err
  with pytest.raises(SystemExit, match="give one or more --workdirs"):
    cli.main(["trained", "--out", "unused"])


@pytest.mark.slow
def test_notebook_executes(trained_run):
  # The run has an eval.json: the trained section runs without restoring a
  # checkpoint (test_trained_diagnostics_* covers that), so the kernel stays light.
  nb = testing.execute_notebook(NOTEBOOK, ATTNSCALE_WORKDIRS=trained_run)
  images = testing.notebook_outputs(nb, "image/png")
  assert len(images) >= 4  # one figure per study


def test_a_new_study_is_one_module_and_one_registry_line(tmp_path, monkeypatch, capsys):
  from attnscale.studies import registry
  module = tmp_path / "toy_study.py"
  module.write_text(
      "from attnscale.experiments import reporting\n"
      "from attnscale.studies import registry\n\n"
      "def run_cli(args):\n"
      "  fig = reporting.new_figure(2, 2)\n"
      "  rows = [{'x': 1, 'y': args.toy_factor}]\n"
      "  return reporting.write_study(fig, rows, args.out, 'toy', 'Toy', ['a toy study'])\n\n"
      "def add_arguments(p):\n"
      "  p.add_argument_group('toy').add_argument('--toy-factor', type=float, default=2.0)\n\n"
      "STUDY = registry.Study(run_cli, in_all=False, arguments=add_arguments)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setitem(registry.REGISTRY, "toy", "toy_study:STUDY")
  cli.main(["toy", "--out", str(tmp_path / "out"), "--toy-factor", "3"])
  assert "a toy study" in capsys.readouterr().out
  assert (tmp_path / "out" / "toy.csv").read_text().splitlines() == ["x,y", "1,3"]
  assert "toy" not in cli.selected(cli.parse_args(["all", "--out", "unused"]))
