"""A BERT WordPiece vocabulary trained from a corpus (HF `tokenizers`).

BERT's uncased tokenizer (Devlin et al. 2019; Wu et al. 2016 for WordPiece):
NFD + lowercase + accent stripping, split on whitespace and punctuation, then
greedy longest-match-first word pieces with "##" marking a continuation.

WikiText's own markers are kept as single pieces, never split or learned from:
`<unk>` (the corpus's rare-word token: a normal token to the model) and
` @-@ `, ` @,@ `, ` @.@ ` (its tokenized hyphen, thousands separator and
decimal point).

Ids: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, then the WikiText markers,
then every other piece in code-point order. The trainer's own id order depends
on Rust HashMap iteration and differs between processes (its set of pieces does
not), so sorting makes the vocabulary file a function of the corpus alone: train
twice, get the same file. Training has no randomness, so no seed is involved.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import trainers

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIALS = (PAD, UNK, CLS, SEP, MASK)  # ids 0..4, in this order
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIALS))
WIKITEXT_MARKERS = ("<unk>", "@-@", "@,@", "@.@")  # single pieces, ids 5..8
_MARKER_RE = re.compile("(" + "|".join(re.escape(m) for m in WIKITEXT_MARKERS) + ")")
MAX_CHARS_PER_WORD = 100  # BERT's: a longer word becomes [UNK]


def _empty(vocab: dict[str, int] | None = None) -> Tokenizer:
  tok = Tokenizer(models.WordPiece(vocab=vocab or {}, unk_token=UNK,
                                   max_input_chars_per_word=MAX_CHARS_PER_WORD))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)  # + strip accents, clean text
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  # cleanup=False: keep "word ," as is (the default would glue punctuation).
  tok.decoder = decoders.WordPiece(cleanup=False)
  return tok


def train(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2) -> "WordPiece":
  """Trains a WordPiece vocabulary of at most `vocab_size` pieces (specials included).

  Deterministic: the same texts give the same vocabulary, in any process.
  """
  reserved = SPECIALS + WIKITEXT_MARKERS
  if vocab_size <= len(reserved):
    raise ValueError(f"vocab_size must be > {len(reserved)}, got {vocab_size}")
  trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(reserved),
                                      min_frequency=min_frequency, show_progress=False)
  tok = _empty()
  # The markers are reserved pieces: blank them out so they are not also
  # counted as "<", "unk", ">" pieces.
  tok.train_from_iterator((_MARKER_RE.sub(" ", t) for t in texts), trainer)
  learned = sorted(set(tok.get_vocab()) - set(reserved))
  return WordPiece({piece: i for i, piece in enumerate(list(reserved) + learned)})


class WordPiece:
  """Encoder/decoder over a fixed vocabulary {piece: id}."""

  def __init__(self, vocab: dict[str, int]):
    for i, piece in enumerate(SPECIALS + WIKITEXT_MARKERS):
      if vocab.get(piece) != i:
        raise ValueError(f"vocabulary must map {piece!r} to {i}, got {vocab.get(piece)}")
    self.vocab = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    self._tok = _empty(self.vocab)
    self._tok.add_special_tokens([AddedToken(s, normalized=False) for s in SPECIALS])
    self._tok.add_tokens([AddedToken(m, normalized=False) for m in WIKITEXT_MARKERS])

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  @property
  def num_reserved(self) -> int:
    """Ids below this are the specials; the rest (markers included) are text."""
    return len(SPECIALS)

  def save(self, path) -> None:
    """Writes {"vocab": {piece: id}} as JSON (sorted by id: a stable file)."""
    with open(path, "w", encoding="utf-8") as f:
      json.dump({"vocab": self.vocab}, f, ensure_ascii=False, indent=0)

  @classmethod
  def load(cls, path) -> "WordPiece":
    with open(path, encoding="utf-8") as f:
      return cls(json.load(f)["vocab"])

  def encode(self, text: str) -> np.ndarray:
    """int32 piece ids of `text`, without [CLS]/[SEP]."""
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, np.int32)

  def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(e.ids, np.int32)
            for e in self._tok.encode_batch(texts, add_special_tokens=False)]

  def decode(self, ids) -> str:
    """Text of `ids`, specials dropped, pieces joined ("##" glued to the left)."""
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

  def normalize(self, text: str) -> str:
    """What `decode(encode(text))` gives for text without [UNK]s: lowercased,
    accents stripped, punctuation split off, single spaces."""
    words = []
    for i, part in enumerate(_MARKER_RE.split(text)):
      if i % 2:  # a WikiText marker, kept whole
        words.append(part)
      else:
        normed = self._tok.normalizer.normalize_str(part)
        words += [w for w, _ in self._tok.pre_tokenizer.pre_tokenize_str(normed)]
    return " ".join(words)
