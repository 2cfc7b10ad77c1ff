"""Shared fixtures: random q, k, v and every registered scaling with test params,
synthetic WikiText, a localhost file server and a per-module XLA compilation cache."""

import contextlib
import functools
import http.server
import threading

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache

from attnscale import scalings

# (id, name, params): every registered name at least once, plus variants.
SCALING_CASES = [
    ("standard", "standard", {}),
    ("none", "none", {}),
    ("key_norm_sum", "key_norm_sum", {}),
    ("key_norm_mean", "key_norm_mean", {}),
    ("key_norm_power_2", "key_norm_power", {"p": 2.0}),
    ("key_norm_power_0.5", "key_norm_power", {"p": 0.5}),
    ("cosine", "cosine", {"temperature": 6.0}),
    ("qk_layernorm", "qk_layernorm", {}),
    ("fully_scaled", "fully_scaled", {}),
    ("unit_scaled", "unit_scaled", {}),
]


def test_cases_cover_registry():
  assert {name for _, name, _ in SCALING_CASES} == set(scalings.names())


def scaling_params(ids=None):
  return [pytest.param(name, params, id=i) for i, name, params in SCALING_CASES
          if ids is None or i in ids]


def random_qkv(seed=0, B=2, T=12, S=12, N=4, K=2, H=8, dtype=jnp.float32):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  q = jax.random.normal(kq, (B, T, N, H), dtype)
  k = jax.random.normal(kk, (B, S, K, H), dtype)
  v = jax.random.normal(kv, (B, S, K, H), dtype)
  return q, k, v


def padding_mask(lengths, S):
  """[B, 1, 1, S] key mask: True for the first lengths[b] keys."""
  return (jnp.arange(S)[None, :] < jnp.asarray(lengths)[:, None])[:, None, None, :]


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


@pytest.fixture(scope="module")
def compilation_cache_dir(tmp_path_factory):
  """A persistent XLA cache for one test module: runs of one config compile once.

  Compilation is most of a test-preset run on CPU (about 8 s of 10); the
  end-to-end modules rerun the same config many times. Restored afterwards.
  Use with `pytestmark = pytest.mark.usefixtures("compilation_cache_dir")`.
  """
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  saved = {name: getattr(jax.config, name) for name in names}
  jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla_cache")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  compilation_cache.reset_cache()
  yield
  for name, value in saved.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):

  def log_message(self, *args):  # Keeps pytest's captured output clean.
    pass


@contextlib.contextmanager
def serve_directory(directory):
  """Serves `directory` on 127.0.0.1 (an ephemeral port); yields the base URL.

  The builders' online branches are tested against it: no test leaves the machine.
  """
  handler = functools.partial(_QuietHandler, directory=str(directory))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    yield f"http://127.0.0.1:{server.server_port}"
  finally:
    server.shutdown()
    server.server_close()
