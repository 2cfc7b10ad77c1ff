"""A ~8k subword vocabulary trained from a corpus: SentencePiece BPE with BERT's specials.

SentencePiece (Kudo & Richardson 2018) BPE (Sennrich et al. 2016), NFKC with
case folding (uncased, as bert-base-uncased), whitespace marked by "▁" so
decoding is exact. Chosen over HF `tokenizers`' WordPiece trainer because that
one breaks ties between equally frequent merges in Rust HashMap order, which
differs between processes: the same corpus gave different vocabularies.
SentencePiece breaks ties by the pieces themselves, so the model file is a
function of (corpus, vocab_size, seed) — the seed only matters when the corpus
is larger than `MAX_TRAIN_SENTENCES` and a sample is drawn.

Ids: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4 (BERT's specials), then
WikiText's own markers as single pieces that are never split: `<unk>` (the
corpus's rare-word token, a normal token to the model) and `@-@`, `@,@`, `@.@`
(its tokenized hyphen, thousands separator and decimal point), then the rest.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIALS = (PAD, UNK, CLS, SEP, MASK)  # ids 0..4, in this order
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIALS))
WIKITEXT_MARKERS = ("<unk>", "@-@", "@,@", "@.@")  # single pieces, ids 5..8
MAX_TRAIN_SENTENCES = 2_000_000  # more paragraphs than this: a seeded sample
_MAX_PARAGRAPH_BYTES = 1 << 16  # SentencePiece skips longer inputs (default 4192)


def train(texts: Sequence[str], vocab_size: int = 8192, seed: int = 0) -> Tokenizer:
  """Trains a BPE vocabulary of `vocab_size` pieces (specials included).

  Deterministic: the same texts, size and seed give the same model file in any
  process (single-threaded training; ties broken by piece).
  """
  reserved = len(SPECIALS) + len(WIKITEXT_MARKERS)
  if vocab_size <= reserved:
    raise ValueError(f"vocab_size must be > {reserved}, got {vocab_size}")
  model = io.BytesIO()
  spm.set_random_generator_seed(seed)
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
      model_type="bpe", normalization_rule_name="nmt_nfkc_cf", character_coverage=1.0,
      pad_id=PAD_ID, pad_piece=PAD, unk_id=UNK_ID, unk_piece=UNK, bos_id=-1, eos_id=-1,
      control_symbols=[CLS, SEP, MASK], user_defined_symbols=list(WIKITEXT_MARKERS),
      # A small corpus may not have vocab_size pieces: take what there is.
      hard_vocab_limit=False, input_sentence_size=MAX_TRAIN_SENTENCES,
      shuffle_input_sentence=True, max_sentence_length=_MAX_PARAGRAPH_BYTES,
      num_threads=1, minloglevel=2)
  return Tokenizer(model.getvalue())


class Tokenizer:
  """Encoder/decoder of a trained SentencePiece model (its serialized bytes)."""

  def __init__(self, model_proto: bytes):
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    for i, piece in enumerate(SPECIALS + WIKITEXT_MARKERS):
      if self._sp.id_to_piece(i) != piece:
        raise ValueError(f"the tokenizer must map {piece!r} to id {i}, got "
                         f"{self._sp.id_to_piece(i)!r}")

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def pieces(self) -> list[str]:
    return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]

  def save(self, path) -> None:
    with open(path, "wb") as f:
      f.write(self.model_proto)

  @classmethod
  def load(cls, path) -> Tokenizer:
    with open(path, "rb") as f:
      return cls(f.read())

  def encode(self, text: str) -> np.ndarray:
    """int32 piece ids of `text`, without [CLS]/[SEP]."""
    return np.asarray(self._sp.encode(text), np.int32)

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(ids, np.int32) for ids in self._sp.encode(texts)]

  def decode(self, ids) -> str:
    """Text of `ids`; [PAD], [CLS], [SEP] and [MASK] decode to nothing."""
    return self._sp.decode([int(i) for i in ids])

  def normalize(self, text: str) -> str:
    """What `decode(encode(text))` gives (for text without unknown characters):
    NFKC, case-folded, whitespace collapsed."""
    # SentencePiece marks whitespace (and a dummy prefix) with "▁".
    return self._sp.normalize(text).replace("\u2581", " ").strip()
