"""Masked-LM data: WikiText paragraphs as padded [CLS] ... [SEP] rows, dynamic masking.

Rows. Each paragraph's subword ids are cut into consecutive pieces of at most
T - 2 ids (no text is dropped; a row never spans two paragraphs), and each
piece becomes [CLS] ids [SEP] [PAD]...: single-segment BERT inputs (as RoBERTa,
no next-sentence task). Short paragraphs and paragraph tails make real
padding: 32% of the positions at T = 128 on WikiText-2.

Masking (Devlin et al. 2019, BERT's create_pretraining_data.py): per row,
k = max(1, round(mask_rate * n_real)) of its n_real text ids (never [CLS],
[SEP] or [PAD]) are selected uniformly without replacement; each selected id
becomes [MASK] with probability mask_token_rate, a random text id (never a
special) with random_token_rate, and stays itself otherwise (80/10/10 by
default). The loss is on the selected positions only, which come as a fixed
number P of slots per row (weight 0 for unused slots): BERT's
`max_predictions_per_seq` (`config.max_predictions_per_seq`; by default
`num_predictions` = ceil(mask_rate (T - 2)), 19 at T = 128), and a row never has
more than P selections. The model gathers the final residual stream at those P
positions before its MLM head (`attnscale.models.base.gather_positions`), so the
head's dense + GELU + LN and the [P, D] x [D, V] vocabulary projection run on
P ~ 0.15 T positions instead of T.
Masks are redrawn at every step (RoBERTa's dynamic masking) from (seed, step).

Determinism: a training batch is a function of (rows, seed, step): an epoch
order from `default_rng([seed, 0, epoch])`, masks from `default_rng([seed, 1,
step])`. Every process builds the same global batch and keeps its own rows, and
a resumed run sees exactly the batches an uninterrupted one would. Evaluation
masks come from a fixed seed per row, so every run (any seed, batch size or
device count) is scored on the same masked tokens.

Dimension legend: G global batch rows, B this process's rows, T sequence
length, P prediction slots per row, R rows of a split.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np

from attnscale.data import paths, wikitext
from attnscale.data import tokenizer as tokenizer_lib
from attnscale.data.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID

EVAL_MASK_SEED = 12345  # fixed: every run is evaluated on the same masked tokens


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
  """The tokenized paragraphs of each split, flat, and the tokenizer.

  Attributes:
    ids: {split: int32 ids of all its paragraphs, concatenated}.
    offsets: {split: int64 [num_paragraphs + 1]; paragraph i is ids[o[i]:o[i+1]]}.
    tokenizer: the subword vocabulary the ids index.
  """

  ids: dict[str, np.ndarray]
  offsets: dict[str, np.ndarray]
  tokenizer: tokenizer_lib.Tokenizer


def load_wikitext(data_dir: str | None = None, name: str = "wikitext2",
                  splits=("train", "validation")) -> Corpus:
  """Prepares (once) and reads the `wikitext_paragraphs/{name}` TFDS dataset.

  Args:
    data_dir: TFDS data dir; None = TFDS's default ($TFDS_DATA_DIR or
      ~/tensorflow_datasets).
    name: builder config, "wikitext2" or "wikitext103".
    splits: which splits to read.
  """
  if name not in wikitext.WikitextParagraphs.builder_configs:
    raise ValueError(f"config.dataset must be one of "
                     f"{list(wikitext.WikitextParagraphs.builder_configs)}, got {name!r}")
  builder = paths.prepare(lambda: wikitext.WikitextParagraphs(
      config=name, data_dir=data_dir, file_format="array_record"))
  tokenizer = tokenizer_lib.Tokenizer.load(builder.data_path / wikitext.TOKENIZER_FILE)
  source = builder.as_data_source()
  ids, offsets = {}, {}
  for split in splits:
    records = source[split]
    paras = [r["ids"] for r in records.__getitems__(range(len(records)))]
    offsets[split] = np.concatenate([[0], np.cumsum([len(p) for p in paras])]).astype(np.int64)
    ids[split] = np.concatenate(paras).astype(np.int32) if paras else np.zeros(0, np.int32)
  return Corpus(ids=ids, offsets=offsets, tokenizer=tokenizer)


@dataclasses.dataclass(frozen=True, eq=False)
class Rows:
  """A split cut into rows of at most T - 2 ids: row r is ids[start[r]:start[r]+length[r]]."""

  ids: np.ndarray
  start: np.ndarray
  length: np.ndarray
  seq_len: int

  def __len__(self) -> int:
    return len(self.start)

  def tokens(self, rows) -> np.ndarray:
    """int32 [len(rows), T]: [CLS] ids [SEP] [PAD]... for the given row indices."""
    rows = np.asarray(rows)
    T = self.seq_len
    start, length = self.start[rows], self.length[rows]
    j = np.arange(T - 2)
    inside = j[None, :] < length[:, None]
    idx = np.where(inside, start[:, None] + j[None, :], 0)
    out = np.full((len(rows), T), PAD_ID, np.int32)
    out[:, 0] = CLS_ID
    out[:, 1:T - 1] = np.where(inside, self.ids[idx] if len(self.ids) else PAD_ID, PAD_ID)
    out[np.arange(len(rows)), length + 1] = SEP_ID
    return out


def make_rows(ids: np.ndarray, offsets: np.ndarray, seq_len: int) -> Rows:
  """Cuts every paragraph into consecutive rows of at most seq_len - 2 ids."""
  if seq_len < 3:
    raise ValueError(f"seq_len must be >= 3 ([CLS], one id, [SEP]), got {seq_len}")
  width = seq_len - 2
  lengths = np.diff(offsets)
  lengths_kept = lengths[lengths > 0]
  starts_kept = offsets[:-1][lengths > 0]
  per_para = -(-lengths_kept // width)  # ceil
  para = np.repeat(np.arange(len(per_para)), per_para)
  k = np.arange(len(para)) - np.repeat(np.cumsum(per_para) - per_para, per_para)
  start = starts_kept[para] + k * width
  length = np.minimum(width, lengths_kept[para] - k * width)
  return Rows(ids=ids, start=start.astype(np.int64), length=length.astype(np.int64),
              seq_len=seq_len)


def num_predictions(seq_len: int, mask_rate: float, max_predictions: int | None = None) -> int:
  """Prediction slots P per row: `max_predictions` when given, else enough for
  round(mask_rate * (T - 2)) selections, ceil(mask_rate * (T - 2))."""
  if max_predictions is not None:
    if not 1 <= max_predictions <= seq_len - 2:
      raise ValueError(f"config.max_predictions_per_seq must be in [1, seq_len - 2 = "
                       f"{seq_len - 2}] or None, got {max_predictions}")
    return max_predictions
  return max(1, math.ceil(mask_rate * (seq_len - 2)))


def mask_tokens(tokens_GT: np.ndarray, rng: np.random.Generator, *, vocab_size: int,
                mask_rate: float = 0.15, mask_token_rate: float = 0.8,
                random_token_rate: float = 0.1, max_predictions: int | None = None,
                num_reserved: int = len(tokenizer_lib.SPECIALS)) -> dict[str, np.ndarray]:
  """BERT's masking of a batch of [CLS] ... [SEP] [PAD] rows (see the module doc).

  Args:
    tokens_GT: int32 rows; ids below `num_reserved` are specials.
    rng: the randomness (one draw of the whole batch, row-major).
    vocab_size: random replacements are drawn from [num_reserved, vocab_size).
    max_predictions: the slots P per row (BERT's max_predictions_per_seq): at
      most P tokens of a row are selected; None = `num_predictions(T, mask_rate)`.

  Returns:
    {"inputs": [G, T] masked tokens, "positions": [G, P] selected positions
    (0 in unused slots), "targets": [G, P] the original ids there, "weights":
    [G, P] float32, 1 for a selected slot}.
  """
  G, T = tokens_GT.shape
  P = num_predictions(T, mask_rate, max_predictions)
  real_GT = tokens_GT >= num_reserved
  n_real_G = real_GT.sum(1)
  k_G = np.where(n_real_G > 0, np.maximum(1, np.rint(mask_rate * n_real_G)), 0).astype(np.int64)
  k_G = np.minimum(k_G, P)
  # The k smallest of iid uniforms over the real positions: a uniform k-subset.
  u_GT = np.where(real_GT, rng.random((G, T)), 2.0)
  order_GP = np.argsort(u_GT, axis=1, kind="stable")[:, :P]
  weights_GP = np.arange(P)[None, :] < k_G[:, None]
  positions_GP = np.where(weights_GP, order_GP, 0)
  targets_GP = np.where(weights_GP, np.take_along_axis(tokens_GT, positions_GP, 1), PAD_ID)
  action_GP = rng.random((G, P))
  random_GP = rng.integers(num_reserved, vocab_size, (G, P))
  replaced_GP = np.where(action_GP < mask_token_rate, MASK_ID,
                         np.where(action_GP < mask_token_rate + random_token_rate,
                                  random_GP, targets_GP))
  inputs_GT = tokens_GT.copy()
  # Unused slots point at position 0 ([CLS], never selected) and write it back.
  np.put_along_axis(inputs_GT, positions_GP,
                    np.where(weights_GP, replaced_GP, CLS_ID).astype(np.int32), 1)
  return {"inputs": inputs_GT, "positions": positions_GP.astype(np.int32),
          "targets": targets_GP.astype(np.int32), "weights": weights_GP.astype(np.float32)}


def epoch_rows(num_rows: int, batch_size: int, seed: int, step: int) -> np.ndarray:
  """Row indices of global batch `step`: a fresh permutation of the rows each epoch."""
  i_G = step * batch_size + np.arange(batch_size)
  epoch_G, pos_G = i_G // num_rows, i_G % num_rows
  rows_G = np.empty(batch_size, np.int64)
  for epoch in np.unique(epoch_G):
    perm = np.random.default_rng([seed, 0, int(epoch)]).permutation(num_rows)
    rows_G[epoch_G == epoch] = perm[pos_G[epoch_G == epoch]]
  return rows_G


def get_batch(rows: Rows, *, batch_size: int, seed: int, step: int, vocab_size: int,
              process_index: int = 0, process_count: int = 1,
              **mask_args) -> dict[str, np.ndarray]:
  """This process's rows of the masked global batch for `step` (see the module doc)."""
  if seed < 0 or step < 0:
    raise ValueError(f"seed and step must be >= 0, got seed={seed}, step={step}")
  if process_count <= 0 or batch_size % process_count:
    raise ValueError(f"batch_size={batch_size} must be divisible by "
                     f"process_count={process_count}")
  if len(rows) == 0:
    raise ValueError("the split has no rows")
  tokens_GT = rows.tokens(epoch_rows(len(rows), batch_size, seed, step))
  batch = mask_tokens(tokens_GT, np.random.default_rng([seed, 1, step]),
                      vocab_size=vocab_size, **mask_args)
  B = batch_size // process_count
  return {k: v[process_index * B:(process_index + 1) * B] for k, v in batch.items()}


def eval_batches(rows: Rows, *, batch_size: int, vocab_size: int,
                 **mask_args) -> Iterator[dict[str, np.ndarray]]:
  """Every row of a split once, in order, masked with a fixed seed per row.

  Row r's masks come from `default_rng([EVAL_MASK_SEED, r])`, independent of
  the batch size. The last batch is filled with all-[PAD] rows of weight 0, so
  every batch has the same shape (one compiled eval step).

  Yields:
    batches like `mask_tokens`'s, global (all processes' rows).
  """
  R = len(rows)
  for lo in range(0, R, batch_size):
    idx = np.arange(lo, min(lo + batch_size, R))
    tokens = rows.tokens(idx)
    parts = [mask_tokens(tokens[i:i + 1], np.random.default_rng([EVAL_MASK_SEED, int(r)]),
                         vocab_size=vocab_size, **mask_args) for i, r in enumerate(idx)]
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    fill = batch_size - len(idx)
    if fill:
      batch = {k: np.concatenate([v, np.zeros((fill,) + v.shape[1:], v.dtype)])
               for k, v in batch.items()}
    yield batch
