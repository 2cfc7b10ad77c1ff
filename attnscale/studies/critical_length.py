"""critical_length: at which inverse temperature beta attention becomes selective, against n.

One query q and n keys k_j, logits beta <q, k_j> with |q| = 1 and E|k|^2 = 1, so
beta is the logit scale of unit vectors (standard attention's 1/sqrt(d) times
|q| |k| in a model). For each n and beta the weights p = softmax(beta <q, k>)
give the selectivity measures

    top mass   p_max = max_j p_j            (1/n uniform ... 1 one key)
    entropy    H = -sum_j p_j log p_j       (log n uniform ... 0 one key)
    n_eff      1 / sum_j p_j^2              (n uniform ... 1 one key)
    distance   |sum_j p_j v_j - mean_j v_j|, v_j = k_j (the identity value matrix)

and the critical beta*(n, d) is where the top mass crosses 1/2 (the primary
criterion) or where the entropy falls to half its maximum, (log n) / 2 (the
secondary one). Both are exact roots (Newton in log beta inside a bisection bracket: p_max rises and H
falls monotonically with beta, dH/dbeta = -beta Var_p <q, k>).

Why the top mass: "Scaling limits of long-context transformers" (Bruno,
Rigollet, Chen, Polyanskiy, Lin; arXiv 2605.08505, 2026) split the large-n
limit into a subcritical regime (no key keeps a fixed share of the mass: a local
average), a critical one (a finite set of nearest keys keeps macroscopic mass)
and a supercritical one (all mass on the closest key). A fixed level of the top
key's mass (any level in (0, 1); 1/2 here) therefore sits inside the critical
window and scales as its beta_n* does; for keys uniform on S^{d-1} that is
n^{2/(d-1)}. The entropy criterion (log n)/2 instead marks where attention stops
averaging globally: a different scale, shown to say that the law depends on it.
Chen, Lin, Polyanskiy & Rigollet (arXiv 2510.05554, ICLR 2026) find
beta_n ~ log n critical in a model where each token sees itself (<x, x> = 1
against about 0 for the others), the `planted` keys here.

Key distributions (`DISTRIBUTIONS`): `sphere` (uniform on S^{d-1}), `gaussian`
(N(0, I/d)), `planted` (sphere, with the first key equal to q) and `trained`
(the q and k of one head of a trained char LM, from its own forward pass
`Model.attention_calls`, pooled over positions of validation text; q
normalised to 1, k divided by its pool's rms norm). Each seed draws a new query
and keys; the n keys are the first n of one draw of `max_n`, so a seed's
beta*(n) is one curve. beta* is fitted against n as a power law n^alpha and as
(log n)^p by least squares on the log of the seeds' geometric mean, with 95%
intervals from a bootstrap over seeds.

Everything is numpy in float64 for the roots (a key's gap to the best key,
beta * gap, is what the softmax sees) and float32 for the curves.

  python -m attnscale.studies critical_length --out docs/results/critical_length \\
      --workdirs runs/char_cpu_standard
  python -m attnscale.studies critical_length --out OUT \\
      --critical_raw docs/results/critical_length/critical_length_raw.csv   # tables only
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os

import numpy as np

from attnscale.experiments import reporting
from attnscale.studies import registry

DISTRIBUTIONS = ("sphere", "gaussian", "planted", "trained")
CRITERIA = {"top_half": "top mass = 1/2", "entropy_half": "entropy = (log n)/2"}
CURVE_NS = (256, 4096, 65536)  # the n of the selectivity curves (those <= max_n, else max_n)
LOG_BETA_RANGE = (-4.0, 16.0)  # natural-log bracket of every root: beta in [0.018, 9e6]
BOOTSTRAP = 2000
TAIL_N = 4096  # the tail fit: n >= this


# ---------------------------------------------------------------------------
# Keys.


def unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def draw(dist: str, d: int, n: int, rng: np.random.Generator, pool=None):
  """(q [d], k [n, d]) of one seed: |q| = 1, E|k|^2 = 1 (float32)."""
  if dist == "trained":
    q_pool, k_pool = pool
    q = q_pool[rng.integers(len(q_pool))]
    return q, k_pool[rng.choice(len(k_pool), size=n, replace=False)]
  q = unit(rng.standard_normal(d)).astype(np.float32)
  k = rng.standard_normal((n, d), dtype=np.float32)
  if dist == "gaussian":
    return q, k / np.float32(math.sqrt(d))
  k = unit(k)
  if dist == "planted":
    k[0] = q
  return q, k


def trained_pool(workdir: str, *, layer: int, head: int, max_n: int):
  """(q_pool, k_pool, info) of one head of the run in `workdir`, from its model's own
  forward pass on validation batches: q rows normalised to 1, k rows divided by
  their rms norm; `info` says what they came from and the model's own logit scale
  beta_model = |q| k_rms / sqrt(d) (standard attention's, per query)."""
  import jax  # imported here: the synthetic part needs no JAX

  from attnscale import tasks
  from attnscale.config import labels
  from attnscale.evaluation import eval_lib

  config = eval_lib.load_config(workdir)
  task = tasks.get_task(config)
  model, step, _ = eval_lib.restore(config, workdir)
  calls = jax.jit(lambda t: [(c.q_BTNH, c.k_BSKH) for c in model.attention_calls(t)])
  layer = layer % config.model.num_layers  # -1: the last
  qs, ks, index = [], [], 0
  while sum(len(k) for k in ks) < max_n + 1:
    batch = task.val_batch(index)
    q_BTNH, k_BSKH = jax.device_get(calls(batch["inputs"])[layer])
    N, K = q_BTNH.shape[2], k_BSKH.shape[2]
    qs.append(q_BTNH[:, :, head].reshape(-1, q_BTNH.shape[-1]))
    ks.append(k_BSKH[:, :, head // (N // K)].reshape(-1, k_BSKH.shape[-1]))
    index += 1
  q = np.concatenate(qs).astype(np.float64)
  k = np.concatenate(ks).astype(np.float64)
  d = q.shape[-1]
  q_norm, k_rms = np.linalg.norm(q, axis=-1), math.sqrt(np.mean(np.sum(k * k, axis=-1)))
  beta_model = q_norm * k_rms / math.sqrt(d)
  info = {"run": labels.run_label(config), "step": int(step), "layer": layer, "head": head,
          "d": d, "pool": len(k), "beta_model_median": float(np.median(beta_model)),
          "beta_model_q25": float(np.quantile(beta_model, 0.25)),
          "beta_model_q75": float(np.quantile(beta_model, 0.75)),
          "block_size": int(config.model.block_size)}
  return (unit(q).astype(np.float32), (k / k_rms).astype(np.float32)), info


# ---------------------------------------------------------------------------
# Selectivity and the critical beta.


def _moments(gap, beta):
  """(z, E_p[gap], Var_p[gap]) for p_j = exp(-beta gap_j) / z, gap_j = max x - x_j >= 0:
  the top mass is 1/z and the entropy beta E_p[gap] + log z."""
  e = np.exp(-beta * gap)
  z = e.sum()
  m1 = e @ gap / z
  return z, m1, max(e @ (gap * gap) / z - m1 * m1, 0.0)


def critical_beta(x, criterion: str, guess: float | None = None, tol: float = 1e-9) -> float:
  """beta* of the logits' directions x_j = <q, k_j> (float64): the root in u = log beta
  of log z - log 2 (top mass 1/2; d/du = -beta E_p[gap]) or of H - (log n)/2 (d/du =
  -beta^2 Var_p[gap]), both decreasing in u; Newton's steps kept inside a bisection
  bracket, from `guess` (e.g. the root at a smaller n) if given. NaN when the bracket
  holds no crossing (n = 2, ties at the top)."""
  gap = x.max() - x
  half_log_n = 0.5 * math.log(len(x))

  def f(u):  # (value, derivative in u)
    beta = math.exp(u)
    z, m1, var = _moments(gap, beta)
    if criterion == "top_half":
      return math.log(z) - math.log(2.0), float(-beta * m1)
    return float(beta * m1) + math.log(z) - half_log_n, float(-beta * beta * var)

  lo, hi = LOG_BETA_RANGE
  if f(lo)[0] <= 0 or f(hi)[0] > 0:
    return math.nan
  u = math.log(guess) if guess and lo < math.log(guess) < hi else 0.5 * (lo + hi)
  for _ in range(200):
    value, slope = f(u)
    if value > 0:
      lo = u
    else:
      hi = u
    step = -value / slope if slope < 0 else math.inf
    nxt = u + step
    if not lo < nxt < hi:
      nxt = 0.5 * (lo + hi)
    if abs(nxt - u) < tol or hi - lo < tol:
      return math.exp(nxt)
    u = nxt
  return math.exp(u)


def selectivity(q, k, betas):
  """Per beta: (top mass, entropy / log n, n_eff / n, distance of the output from the
  values' mean), float32 products, float64 sums."""
  x = (k @ q).astype(np.float64)
  n = len(x)
  logits = np.outer(betas, x - x.max())
  e = np.exp(logits)
  z = e.sum(axis=1, keepdims=True)
  p = e / z
  top = p.max(axis=1)
  entropy = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)).sum(axis=1)
  n_eff = 1.0 / np.square(p).sum(axis=1)
  out = p.astype(np.float32) @ k
  dist = np.linalg.norm(out - k.mean(axis=0), axis=1)
  return top, entropy / math.log(n), n_eff / n, dist


# ---------------------------------------------------------------------------
# The study.


@dataclasses.dataclass
class CriticalLengthResult:
  raw: list[dict]  # one row per (dist, d, seed, n): beta* by each criterion
  curves: list[dict]  # seed 0's selectivity against beta at CURVE_NS
  trained: dict | None  # trained_pool's info

  def fits(self) -> list[dict]:
    return fit_rows(self.raw)


def ns_up_to(max_n: int) -> list[int]:
  return [2**e for e in range(4, int(math.log2(max_n)) + 1)]


def critical_length(dims=(16, 32, 64, 128), *, dists=("sphere", "gaussian", "planted"),
                    max_n: int = 65536, seeds: int = 24, seed: int = 0, pool=None,
                    trained_info=None, curve_betas: int = 33) -> CriticalLengthResult:
  """beta*(n) for every distribution, d and seed, and seed 0's selectivity curves.

  `pool` (from `trained_pool`) adds the `trained` distribution at its own d.
  """
  ns = ns_up_to(max_n)
  betas = np.logspace(-1, 5, curve_betas)
  cases = [(dist, d) for dist in dists for d in dims]
  if pool is not None:
    cases.append(("trained", pool[1].shape[1]))
  raw, curves = [], []
  for case_index, (dist, d) in enumerate(cases):
    for s in range(seeds):
      rng = np.random.default_rng([seed, case_index, s])
      q, k = draw(dist, d, max_n, rng, pool)
      x = (k @ q).astype(np.float64)
      previous = {}
      for n in ns:
        previous = {c: critical_beta(x[:n], c, previous.get(c)) for c in CRITERIA}
        raw.append({"dist": dist, "d": d, "seed": s, "n": n, **previous})
      if s:
        continue
      for n in [n for n in CURVE_NS if n <= max_n] or [max_n]:
        top, entropy, n_eff, dist_out = selectivity(q, k[:n], betas)
        curves += [{"dist": dist, "d": d, "n": n, "beta": float(b), "top_mass": float(t),
                    "entropy_over_log_n": float(h), "n_eff_over_n": float(e),
                    "distance": float(o)}
                   for b, t, h, e, o in zip(betas, top, entropy, n_eff, dist_out)]
  return CriticalLengthResult(raw, curves, trained_info)


def _fit(ns, log_beta_XSN, law: str):
  """(slope, rms residual in log beta) of log beta-bar(n) against log n or log log n, with
  log beta-bar the mean over seeds (axis -2) of log beta*; leading axes: resamples."""
  x = np.log(ns) if law == "power" else np.log(np.log(ns))
  x = x - x.mean()
  y = log_beta_XSN.mean(axis=-2)  # the log of the seeds' geometric mean
  y = y - y.mean(axis=-1, keepdims=True)
  slope = y @ x / (x @ x)
  resid = y - slope[..., None] * x
  return slope, np.sqrt(np.mean(resid**2, axis=-1))


def fit_rows(raw: list[dict], seed: int = 0) -> list[dict]:
  """One row per (dist, d, criterion): the fitted exponents with 95% bootstrap
  intervals (seeds resampled with replacement, `BOOTSTRAP` times), beside 2/(d-1)."""
  rows = []
  keys = list(dict.fromkeys((r["dist"], r["d"]) for r in raw))
  for case_index, (dist, d) in enumerate(keys):
    rs = [r for r in raw if (r["dist"], r["d"]) == (dist, d)]
    ns = sorted({r["n"] for r in rs})
    seeds = sorted({r["seed"] for r in rs})
    for criterion, label in CRITERIA.items():
      table = {(r["seed"], r["n"]): r[criterion] for r in rs}
      log_beta_SN = np.log([[table[s, n] for n in ns] for s in seeds])
      tail = [i for i, n in enumerate(ns) if n >= TAIL_N]
      rng = np.random.default_rng([seed, case_index, len(rows)])
      picks = rng.integers(len(seeds), size=(BOOTSTRAP, len(seeds)))
      every = list(range(len(ns)))
      laws = [("alpha", every, "power"), ("p", every, "log"), ("alpha_tail", tail, "power")]
      row = {"dist": dist, "d": d, "criterion": label, "seeds": len(seeds),
             "n": f"{ns[0]}-{ns[-1]}"}
      for name, cols, law in laws:
        if len(cols) < 2:
          row.update({name: math.nan, f"{name}_lo": math.nan, f"{name}_hi": math.nan})
          continue
        sub_ns = [ns[i] for i in cols]
        slope, rms = _fit(sub_ns, log_beta_SN[:, cols], law)
        boot = _fit(sub_ns, log_beta_SN[picks][..., cols], law)[0]  # [BOOTSTRAP]
        row.update({name: float(slope), f"{name}_lo": float(np.quantile(boot, 0.025)),
                    f"{name}_hi": float(np.quantile(boot, 0.975))})
        if name != "alpha_tail":
          row[f"rms_{law}"] = float(rms)
      row["two_over_d_minus_1"] = 2.0 / (d - 1)
      gm = np.exp(log_beta_SN.mean(axis=0))
      row.update({"beta_first": float(gm[0]), "beta_last": float(gm[-1])})
      rows.append(row)
  return rows


def beta_rows(raw: list[dict]) -> list[dict]:
  """The geometric mean of beta* over seeds at each (dist, d, n), with the seeds' range."""
  rows = []
  for dist, d, n in dict.fromkeys((r["dist"], r["d"], r["n"]) for r in raw):
    rs = [r for r in raw if (r["dist"], r["d"], r["n"]) == (dist, d, n)]
    row = {"dist": dist, "d": d, "n": n}
    for c in CRITERIA:
      b = np.array([r[c] for r in rs])
      row.update({c: float(np.exp(np.log(b).mean())), f"{c}_min": float(b.min()),
                  f"{c}_max": float(b.max())})
    rows.append(row)
  return rows


# ---------------------------------------------------------------------------
# Figures.


def plot_beta(raw: list[dict], fits: list[dict]):
  """beta* (top mass = 1/2) against n, one panel per distribution, with both fitted laws."""
  dists = list(dict.fromkeys(r["dist"] for r in raw))
  fig = reporting.new_figure(2.9 * len(dists), 2.8)
  axes = fig.subplots(1, len(dists), squeeze=False)[0]
  table = beta_rows(raw)
  for ax, dist in zip(axes, dists):
    for i, d in enumerate(dict.fromkeys(r["d"] for r in table if r["dist"] == dist)):
      rs = [r for r in table if (r["dist"], r["d"]) == (dist, d)]
      ns = np.array([r["n"] for r in rs], float)
      gm = np.array([r["top_half"] for r in rs])
      st = reporting.style(i)
      ax.plot(ns, gm, linestyle="none", marker=st["marker"], color=st["color"], label=f"d={d}")
      ax.fill_between(ns, [r["top_half_min"] for r in rs], [r["top_half_max"] for r in rs],
                      color=st["color"], alpha=0.15)
      fit = next(f for f in fits if (f["dist"], f["d"]) == (dist, d)
                 and f["criterion"] == CRITERIA["top_half"])
      anchor = float(np.exp(np.mean(np.log(gm))))
      power = ns ** fit["alpha"]
      ax.plot(ns, power * anchor / np.exp(np.mean(np.log(power))), color=st["color"], lw=1)
      log_law = np.log(ns) ** fit["p"]
      ax.plot(ns, log_law * anchor / np.exp(np.mean(np.log(log_law))), color=st["color"],
              lw=1, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    reporting.label_axes(ax, xlabel="n (keys)", ylabel="beta* (top mass = 1/2)",
                         title=f"{dist}: n^alpha (solid), (log n)^p (dotted)")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=6)
  return fig


def plot_curves(curves: list[dict]):
  """Seed 0's top mass, entropy / log n, n_eff / n and output distance against beta, at
  each d's largest n."""
  measures = [("top_mass", "top mass"), ("entropy_over_log_n", "entropy / log n"),
              ("n_eff_over_n", "n_eff / n"), ("distance", "|z - mean v|")]
  dists = list(dict.fromkeys(r["dist"] for r in curves))
  fig = reporting.new_figure(2.4 * len(measures), 1.9 * len(dists))
  axes = fig.subplots(len(dists), len(measures), squeeze=False)
  for row, dist in zip(axes, dists):
    # The largest n of each d: the curves of smaller n are in the CSV.
    largest = {}
    for r in curves:
      if r["dist"] == dist:
        largest[r["d"]] = max(largest.get(r["d"], 0), r["n"])
    cases = list(largest.items())
    for ax, (key, label) in zip(row, measures):
      for i, (d, n) in enumerate(cases):
        rs = [r for r in curves if (r["dist"], r["d"], r["n"]) == (dist, d, n)]
        st = reporting.style(i)
        ax.plot([r["beta"] for r in rs], [r[key] for r in rs], color=st["color"], lw=1,
                label=f"d={d}, n={n}" if key == "top_mass" else None)
      ax.set_xscale("log")
      if key == "n_eff_over_n":
        ax.set_yscale("log")
      reporting.label_axes(ax, xlabel="beta", ylabel=label, title=dist)
      ax.title.set_fontsize(8)
      if key == "top_mass" and ax.get_legend():
        ax.get_legend().set_visible(dist == dists[0])
        if dist == dists[0]:
          ax.legend(fontsize=6)
  return fig


# ---------------------------------------------------------------------------
# Files.

RAW_COLUMNS = ("dist", "d", "seed", "n", *CRITERIA)
FIT_FORMATS = {c: ".3f" for c in ("alpha", "alpha_lo", "alpha_hi", "p", "p_lo", "p_hi",
                                  "alpha_tail", "alpha_tail_lo", "alpha_tail_hi",
                                  "two_over_d_minus_1", "rms_power", "rms_log")}


def read_raw(path: str) -> list[dict]:
  with open(path) as f:
    return [{"dist": r["dist"], "d": int(r["d"]), "seed": int(r["seed"]), "n": int(r["n"]),
             **{c: float(r[c]) for c in CRITERIA}} for r in csv.DictReader(f)]


def write_tables(raw: list[dict], out: str) -> tuple[list[str], list[str]]:
  """critical_length.{csv,md} (the fits) and critical_length_beta.{csv,md} from the raw
  records, and the beta* figure: what `--critical_raw` regenerates."""
  fits = fit_rows(raw)
  seeds = len({r["seed"] for r in raw})
  notes = [f"beta* = the logit scale of unit vectors (|q| = 1, E|k|^2 = 1) where the top key's "
           f"mass crosses 1/2, or where the entropy falls to (log n)/2; {seeds} seeds, each a "
           "new query and keys (the n keys: the first n of one draw).",
           "alpha: log beta* = c + alpha log n; p: log beta* = c + p log log n; least squares on "
           "the log of the seeds' geometric mean at each n; [lo, hi] 95% bootstrap over seeds "
           f"({BOOTSTRAP} resamples). alpha_tail: the power fit on n >= {TAIL_N}. rms_*: each "
           "law's rms residual in log beta* (the smaller fits better). Theory: alpha = 2/(d-1) "
           "(keys uniform on the sphere, n -> infinity, arXiv 2605.08505); p = 1 (the log "
           "law, arXiv 2510.05554)."]
  paths = [reporting.save_figure(plot_beta(raw, fits), out, "critical_length")]
  paths += reporting.write_tables(fits, out, "critical_length",
                                  title="Critical beta against n: the power and log laws fitted", notes=notes,
                                  formats=FIT_FORMATS)
  paths += reporting.write_tables(beta_rows(raw), out, "critical_length_beta",
                                  title="beta* at each n: geometric mean over seeds [min, max]",
                                  notes=notes[:1])
  return paths, notes


def add_arguments(p) -> None:
  g = p.add_argument_group("critical_length")
  g.add_argument("--critical_dims", type=int, nargs="+", default=[16, 32, 64, 128],
                 help="head dims d of the synthetic keys")
  g.add_argument("--critical_max_n", type=int, default=65536,
                 help="the largest n (n = 16, 32, ... up to it)")
  g.add_argument("--critical_seeds", type=int, default=24, help="seeds (query and keys each)")
  g.add_argument("--critical_dists", nargs="+", default=["sphere", "gaussian", "planted"],
                 choices=DISTRIBUTIONS[:-1], help="synthetic key distributions")
  g.add_argument("--critical_layer", type=int, default=-1,
                 help="trained: the layer whose q and k are sampled (--workdirs: one run)")
  g.add_argument("--critical_head", type=int, default=0, help="trained: the query head")
  g.add_argument("--critical_raw", default=None,
                 help="regenerate the tables and the beta* figure from this raw CSV "
                      "(critical_length_raw.csv) instead of sampling")


def check(a, p) -> None:
  if a.study != "critical_length":
    return
  if len(a.workdirs) > 1:
    p.error(f"critical_length takes one --workdirs run (its trained keys), got {len(a.workdirs)}")
  if a.critical_max_n < 16 or a.critical_max_n & (a.critical_max_n - 1):
    p.error(f"--critical_max_n must be a power of 2 >= 16, got {a.critical_max_n}")
  if a.critical_seeds < 2:
    p.error(f"--critical_seeds must be >= 2 (the intervals bootstrap over seeds), "
            f"got {a.critical_seeds}")


def run_critical_length(a):
  if a.critical_raw:
    return write_tables(read_raw(a.critical_raw), a.out)
  pool = info = None
  if a.workdirs:
    pool, info = trained_pool(a.workdirs[0], layer=a.critical_layer, head=a.critical_head,
                              max_n=a.critical_max_n)
  r = critical_length(a.critical_dims, dists=a.critical_dists, max_n=a.critical_max_n,
                      seeds=a.critical_seeds, seed=a.seed, pool=pool, trained_info=info)
  os.makedirs(a.out, exist_ok=True)
  paths = [os.path.join(a.out, "critical_length_raw.csv"),
           os.path.join(a.out, "critical_length_curves.csv")]
  with open(paths[0], "w") as f:
    f.write(reporting.to_csv(r.raw, RAW_COLUMNS))
  with open(paths[1], "w") as f:
    f.write(reporting.to_csv(r.curves, floats=".4g"))
  paths.append(reporting.save_figure(plot_curves(r.curves), a.out, "critical_length_curves"))
  if info is not None:
    paths += reporting.write_tables([{**info, "workdir": a.workdirs[0]}], a.out,
                                    "critical_length_trained",
                                    title="The trained keys: run, head and its own logit scale")
  # The tables come from the raw CSV as written (6 digits), as --critical_raw reads it.
  table_paths, notes = write_tables(read_raw(paths[0]), a.out)
  return paths + table_paths, notes


STUDY = registry.Study(run_critical_length, in_all=False, arguments=add_arguments, check=check)
