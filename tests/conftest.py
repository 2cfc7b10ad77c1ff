"""Shared fixtures: strict rank promotion, synthetic WikiText and one XLA
compilation cache for the run. Helpers tests import live in `attnscale.testing`."""

import os

# The CPU is the only device here. With the CUDA plugin installed (the newest-JAX
# CI leg, for deviceless GPU compilation) JAX would otherwise try to open a GPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# On a GPU (JAX_PLATFORMS=cuda,...) float32 matrix products run in TF32 by default, 10
# mantissa bits: the fused == reference comparisons test float32 arithmetic, so there
# they run at full precision. The CPU has no TF32: nothing changes here.
if os.environ["JAX_PLATFORMS"] != "cpu":
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

# Tests compile hundreds of small programs and run each a few times, so the suite's
# time is mostly XLA:CPU's compiler. Two code-generation choices cut it: LLVM's -O0
# (~40% less compile time; the suite 17.5 -> 13.5 min on 2 cores) and, at -O0, the
# older elemental emitters instead of XLA:CPU's MLIR fusion emitters (another ~40%:
# two test-preset runs compile in 8.4 s instead of 14.9 on the 2-core AMD host,
# 2026-11-26; without -O0 the old emitters are far slower). Both change how the same
# HLO programs become machine code, not the programs: reference == fused comparisons
# and recorded losses hold (to rounding). Subprocesses (train.py, eval.py) inherit
# them. ATTNSCALE_TEST_XLA_OPT=1 runs the suite with XLA's defaults, as users run.
# JAX 0.12's XLA has only the fusion emitters (an unknown flag is fatal), so there
# the flag is left out; importing jaxlib.version starts no backend.
import jaxlib.version  # noqa: E402

TEST_XLA_FLAGS = ["--xla_backend_optimization_level=0"]
if tuple(int(p) for p in jaxlib.version.__version__.split(".")[:2]) < (0, 11):
  TEST_XLA_FLAGS.append("--xla_cpu_use_fusion_emitters=false")
if os.environ.get("ATTNSCALE_TEST_XLA_OPT") != "1":
  os.environ["XLA_FLAGS"] = " ".join(
      [os.environ.get("XLA_FLAGS", ""), *TEST_XLA_FLAGS]).strip()

# A test harness started as a background job (`cmd &` in a script, nohup) runs
# with SIGINT ignored, and an ignored signal stays ignored across exec: the
# Ctrl-C tests' train.py children would then never see their Ctrl-C (train.py
# rightly leaves an inherited SIG_IGN alone). A handled signal resets to the
# default at exec, so handling it here gives every child a normal Ctrl-C.
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
  try:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  except ValueError:  # not the main thread: leave the harness's choice
    pass

import jax  # noqa: E402  (after XLA_FLAGS: the CPU backend reads them when it starts)
import pytest
from jax.experimental.compilation_cache import compilation_cache


@pytest.fixture
def strict_rank_promotion():
  """Implicit rank promotion is an error (a [B, T] silently broadcast against
  [B, T, N] is how per-query factors go wrong). For the attention and model tests:
  `pytestmark = pytest.mark.usefixtures("strict_rank_promotion")`."""
  with jax.numpy_rank_promotion("raise"):
    yield


# ---------------------------------------------------------------------------
# A small synthetic WikiText (same format: headings, blank lines, <unk>, @-@),
# prepared once per session through the real builder; the tests of the masked
# LM never need the 11 MB corpus.

SYNTHETIC_WORDS = ("the of and in to a was is for on as by with he at from his it an were "
                   "are which this be also had first one their its new after but who not "
                   "they have her she two been other when there all during into school "
                   "would more between game season city war film song album river player "
                   "church station national united british american german french played "
                   "released recorded described several including although however").split()


def synthetic_wikitext_text(seed: int, num_articles: int) -> str:
  """WikiText-shaped text: ' = Title = ' headings, paragraphs, blank lines."""
  import numpy as np
  rng = np.random.default_rng(seed)
  weights = 1.0 / np.arange(1, len(SYNTHETIC_WORDS) + 1)  # Zipf-like
  weights /= weights.sum()
  lines = []
  for a in range(num_articles):
    lines += ["", f" = Article {a} = ", ""]
    for s in range(int(rng.integers(1, 4))):
      lines += [f" = = Section {s} = = ", ""]
      for _ in range(int(rng.integers(1, 4))):
        n = int(rng.integers(3, 120))
        words = list(rng.choice(SYNTHETIC_WORDS, size=n, p=weights))
        for i in rng.choice(n, size=max(1, n // 15), replace=False):
          words[i] = str(rng.choice(["<unk>", ",", ".", "1 @,@ 000", "well @-@ known",
                                     "3 @.@ 5", "(", ")", "Café", "\""]))
        lines += [" " + " ".join(words) + " ", ""]
  return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def synthetic_wikitext(tmp_path_factory):
  """(data_root, tfds data_dir) with wikitext2 prepared from synthetic files.

  Only the synthetic files are read unchecked (their sha256 is not the
  corpus's); the production path's checksums stay as they are.
  """
  from attnscale.data import mlm, paths, wikitext
  root = tmp_path_factory.mktemp("wikitext_root")
  (root / "wikitext-2").mkdir()
  for i, stem in enumerate(("train", "valid", "test")):
    (root / "wikitext-2" / f"{stem}.txt").write_text(
        synthetic_wikitext_text(i, 60 if stem == "train" else 8), encoding="utf-8")
  data_dir = str(tmp_path_factory.mktemp("wikitext_tfds"))
  cfg = wikitext.WikitextParagraphs.builder_configs["wikitext2"]
  with pytest.MonkeyPatch.context() as m:
    m.setenv(paths.ENV_VAR, str(root))
    m.setattr(cfg, "local_sha256", {stem: None for stem in cfg.local_sha256})
    mlm.load_wikitext(data_dir)
  return root, data_dir


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
  """One TFDS data dir for the session: tiny Shakespeare is prepared once."""
  if not os.environ.get("ATTNSCALE_DATA"):
    pytest.skip("needs ATTNSCALE_DATA (CI sets it) or network access")
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  from attnscale.data import char_lm
  char_lm.load_tiny_shakespeare(data_dir)
  return data_dir


@pytest.fixture(scope="session", autouse=True)
def compilation_cache_dir(tmp_path_factory):
  """One persistent XLA cache for the run, shared by the xdist workers and the
  train.py/eval.py they start (they inherit JAX_COMPILATION_CACHE_DIR): a program
  compiled in one module is read back in another. Most programs differ between
  tests, so it saved only 4% of the suite (2026-11-26); it holds the same
  executables, so no result changes. It lives in this run's temporary folder:
  every run starts cold, as CI does. Set for the whole session: nothing to restore.
  """
  base = tmp_path_factory.getbasetemp()
  # Under xdist each worker has its own basetemp below the run's folder.
  cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "xla_cache"
  cache.mkdir(exist_ok=True)
  os.environ.update(JAX_COMPILATION_CACHE_DIR=str(cache),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  jax.config.update("jax_compilation_cache_dir", str(cache))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  compilation_cache.reset_cache()
  return cache
