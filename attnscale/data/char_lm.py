"""Character-level language-model data: token streams, random windows, eval.

After nanoGPT (data/shakespeare_char/prepare.py and train.py's get_batch): the
text becomes one flat token array per split, the vocabulary is
`sorted(set(text))` of the whole file (nanoGPT's stoi/itos), and a training
batch is `batch_size` random windows x = tokens[i:i+T], y = tokens[i+1:i+T+1].

Unlike nanoGPT, the window offsets depend on (seed, step) only, so a resumed run
sees exactly the batches an uninterrupted one would, and every process of a
multi-host run draws the same global offsets and keeps its own rows.

Corpora (`DATASETS`, what `config.dataset` names): tiny Shakespeare
(nanoGPT's shakespeare_char) and WikiText-2 as characters.

Dimension legend: G global batch (all processes), B this process's rows,
T sequence length, N number of eval batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds

from attnscale.data import paths, tiny_shakespeare, wikitext_char, windows


def _codepoints(text: str) -> np.ndarray:
  """Unicode code points of `text` as uint32, without a Python-level loop."""
  return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def _encode(vocab: tuple[str, ...], text: str) -> np.ndarray:
  # vocab is sorted by code point, so a binary search gives the token id.
  vocab_cp = _codepoints("".join(vocab))
  cp = _codepoints(text)
  ids = np.searchsorted(vocab_cp, cp).clip(max=len(vocab_cp) - 1)
  unknown = vocab_cp[ids] != cp
  if unknown.any():
    chars = sorted({chr(c) for c in cp[unknown]})
    raise ValueError(f"text has characters not in the vocabulary: {chars!r}")
  return ids.astype(np.int32)


def _decode(vocab: tuple[str, ...], tokens) -> str:
  ids = np.asarray(tokens, dtype=np.int64)
  # Checked because a negative id would silently index from the end.
  if ids.size and (ids.min() < 0 or ids.max() >= len(vocab)):
    raise ValueError(f"token ids must be in [0, {len(vocab)}), got "
                     f"[{ids.min()}, {ids.max()}]")
  return _codepoints("".join(vocab))[ids].tobytes().decode("utf-32-le")


# eq=False: the generated __eq__/__hash__ would compare arrays elementwise and
# fail; identity is what a frozen bundle of arrays needs.
@dataclasses.dataclass(frozen=True, eq=False)
class CharDataset:
  """Token streams of a character-level corpus and its vocabulary.

  Attributes:
    train: int32 tokens of the train split, 1-D.
    validation: int32 tokens of the validation split, 1-D.
    vocab: the characters, sorted; token id i is `vocab[i]`.
  """

  train: np.ndarray
  validation: np.ndarray
  vocab: tuple[str, ...]

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def encode(self, text: str) -> np.ndarray:
    """int32 token ids of `text`; ValueError on a character not in the vocab."""
    return _encode(self.vocab, text)

  def decode(self, tokens) -> str:
    """The text of a 1-D sequence of token ids."""
    return _decode(self.vocab, tokens)


def char_dataset(train_text: str, validation_text: str) -> CharDataset:
  """Tokenizes two splits with the vocabulary of their union (nanoGPT's stoi)."""
  vocab = tuple(sorted(set(train_text) | set(validation_text)))
  return CharDataset(train=_encode(vocab, train_text),
                     validation=_encode(vocab, validation_text), vocab=vocab)


def _read_splits(make_builder: Callable[[], tfds.core.DatasetBuilder]) -> CharDataset:
  """Prepares the builder (array_record, once: `paths.prepare`) and tokenizes its
  two text splits.

  Every character builder stores one record per split holding the split's whole
  text, read back through a TFDS data source: no TensorFlow involved.
  """
  source = paths.prepare(make_builder).as_data_source()
  train, validation = (source[s][0]["text"].decode("utf-8")
                       for s in ("train", "validation"))
  return char_dataset(train, validation)


def load_tiny_shakespeare(data_dir: str | None = None) -> CharDataset:
  """Tiny Shakespeare, tokenized by characters (65 chars, nanoGPT's split).

  Prepares the TFDS dataset `tiny_shakespeare_char` (array_record) on first use,
  from `$ATTNSCALE_DATA` when set, else by download, then reads it back through
  a TFDS data source; no TensorFlow involved.

  Args:
    data_dir: TFDS data dir; None means TFDS's default ($TFDS_DATA_DIR or
      ~/tensorflow_datasets). Downloads, if any, also go under it.

  Returns:
    The train (1,003,854 tokens) and validation (111,540 tokens) streams.
  """
  return _read_splits(lambda: tiny_shakespeare.TinyShakespeareChar(
      data_dir=data_dir, file_format="array_record"))


def load_wikitext2_char(data_dir: str | None = None) -> CharDataset:
  """WikiText-2 (v1) tokenized by characters: the corpus's train and valid files.

  Prepares the TFDS dataset `wikitext2_char` (`attnscale.data.wikitext_char`)
  on first use, as `load_tiny_shakespeare` does.

  Returns:
    The train (10,780,437 tokens) and validation (1,120,192 tokens) streams,
    283 characters.
  """
  return _read_splits(lambda: wikitext_char.Wikitext2Char(
      data_dir=data_dir, file_format="array_record"))


# config.dataset -> loader(data_dir): the corpora a character-level LM trains on.
DATASETS: dict[str, Callable[[str | None], CharDataset]] = {
    "tiny_shakespeare_char": load_tiny_shakespeare,
    "wikitext2_char": load_wikitext2_char,
}


def load(name: str, data_dir: str | None = None) -> CharDataset:
  """The character dataset `name` (a key of `DATASETS`)."""
  if name not in DATASETS:
    raise ValueError(f"config.dataset must be one of {list(DATASETS)}, got {name!r}")
  return DATASETS[name](data_dir)


def get_batch(tokens: np.ndarray, *, batch_size: int, seq_len: int, seed: int,
              step: int, process_index: int = 0,
              process_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """This process's rows of the global random-window batch for `step`.

  `batch_size` windows of `tokens` (1-D, one split) at the offsets
  `attnscale.data.windows.window_starts` draws from `np.random.default_rng([seed,
  step])`, uniform over [0, len - seq_len) as nanoGPT's; the other arguments are
  its own. Process p keeps rows [p * B, (p + 1) * B), B = batch_size //
  process_count.

  Returns:
    (inputs_BxT, targets_BxT), int32, targets = inputs shifted left by one.
  """
  if tokens.ndim != 1 or len(tokens) < seq_len + 1:
    raise ValueError(f"tokens must be 1-D with at least seq_len + 1 = "
                     f"{seq_len + 1} tokens, got shape {tokens.shape}")
  starts_B = windows.window_starts(len(tokens), batch_size=batch_size, seq_len=seq_len,
                                   seed=seed, step=step, process_index=process_index,
                                   process_count=process_count)
  window_BxT1 = tokens[starts_B[:, None] + np.arange(seq_len + 1)].astype(np.int32)
  return window_BxT1[:, :-1], window_BxT1[:, 1:]


def eval_batches(tokens: np.ndarray, *, batch_size: int,
                 seq_len: int) -> Iterator[dict[str, np.ndarray]]:
  """Non-overlapping windows over a whole split; every target counted once.

  Window k has inputs tokens[kT:kT+T] and targets tokens[kT+1:kT+T+1], so the
  len(tokens) - 1 targets are each predicted exactly once (with context
  restarting at every window, unlike a sliding-window eval). The tail is padded
  with token 0 and weight 0, and so is the last batch with whole rows, so every
  batch has the same shape and a jitted eval step compiles once.

  Args:
    tokens: 1-D token stream of one split (at least 2 tokens).
    batch_size: rows per batch B.
    seq_len: window length T.

  Yields:
    {"inputs": [B, T] int32, "targets": [B, T] int32, "weights": [B, T]
    float32}; sum(weights * loss) / sum(weights) over all batches is the mean
    loss per target token (divide by ln 2 for bits per character).
  """
  if batch_size <= 0 or seq_len <= 0:
    raise ValueError(f"batch_size and seq_len must be positive, got "
                     f"batch_size={batch_size}, seq_len={seq_len}")
  if tokens.ndim != 1 or len(tokens) < 2:
    raise ValueError(f"tokens must be 1-D with at least 2 tokens, got shape "
                     f"{tokens.shape}")
  num_targets = len(tokens) - 1
  per_batch = batch_size * seq_len
  num_batches = -(-num_targets // per_batch)
  padded = np.zeros(num_batches * per_batch + 1, np.int32)
  padded[:len(tokens)] = tokens
  weights = np.zeros(num_batches * per_batch, np.float32)
  weights[:num_targets] = 1.0
  shape = (num_batches, batch_size, seq_len)
  inputs_NxBxT = padded[:-1].reshape(shape)
  targets_NxBxT = padded[1:].reshape(shape)
  weights_NxBxT = weights.reshape(shape)
  for i in range(num_batches):
    yield {"inputs": inputs_NxBxT[i], "targets": targets_NxBxT[i],
           "weights": weights_NxBxT[i]}
