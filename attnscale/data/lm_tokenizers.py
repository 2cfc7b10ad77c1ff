"""The tokenizers of token shards: GPT-2's BPE (tiktoken), bytes and spm8k.

    gpt2   GPT-2's byte-level BPE, 50257 ids, <|endoftext|> = 50256: what nanoGPT's
           and llm.c's shards hold. tiktoken fetches its two vocabulary files once
           (then caches them); offline it reads them from a local copy (`gpt2`).
    bytes  UTF-8 bytes 0..255 and an end-of-text id 256: no vocabulary file, so it
           works anywhere (the tests' shards, a CPU run without network).
    spm8k  a SentencePiece BPE vocabulary of 8192 pieces (Kudo & Richardson 2018;
           Sennrich et al. 2016) trained on the shards' own training documents by
           `attnscale.data.tokenizer` (the WikiText BERT's: uncased, NFKC, whitespace
           collapsed to one space), saved beside the shards as tokenizer.model;
           end-of-text = its [SEP] id 3, which decodes to nothing. A subword LM that
           needs no network (WikiText-2: docs/guides/gpt2.md). A corpus with fewer
           distinct merges gives fewer pieces (meta.json's vocab_size says how many).

A tokenizer is named in the shards' meta.json (spm8k: and its model file, by
`tokenizer_model`), so the task that trains on them can decode a sample
(`from_meta`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence

GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
GPT2_FILES = {"vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
              "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"}
VOCAB_DIR_ENV = "ATTNSCALE_DATA"  # a local copy under $ATTNSCALE_DATA/gpt2/ (attnscale.data.paths)
SPM8K_PIECES = 8192
SPM_MODEL_FILE = "tokenizer.model"  # spm8k's vocabulary, beside the shards


@dataclasses.dataclass(frozen=True)
class LMTokenizer:
  """Text <-> token ids for a token LM; `eot` ends (llm.c: starts) each document."""

  name: str
  vocab_size: int
  eot: int
  encode: Callable[[str], list[int]]
  decode: Callable[[Sequence[int]], str]


def bytes_tokenizer() -> LMTokenizer:
  def decode(ids):
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
  return LMTokenizer("bytes", 257, 256, lambda text: list(text.encode("utf-8")), decode)


def _local_gpt2_dir(vocab_dir: str | None) -> str | None:
  if vocab_dir:
    return vocab_dir
  from attnscale.data import paths  # $ATTNSCALE_DATA has one meaning (absolute) everywhere
  root = paths.data_root()
  candidate = os.path.join(root, "gpt2") if root else ""
  if candidate and all(os.path.isfile(os.path.join(candidate, f)) for f in GPT2_FILES):
    return candidate
  return None


def gpt2(vocab_dir: str | None = None) -> LMTokenizer:
  """GPT-2's BPE through tiktoken (`pip install tiktoken`).

  The vocabulary comes from `vocab_dir` (vocab.bpe and encoder.json), else
  $ATTNSCALE_DATA/gpt2/ when both files are there, else tiktoken's own cache
  ($TIKTOKEN_CACHE_DIR) or download. Each file's sha256 is checked.

  Raises:
    ValueError: the vocabulary cannot be had (offline, no local copy); one line
      saying where to put one.
  """
  import tiktoken
  from tiktoken import load as tiktoken_load
  local = _local_gpt2_dir(vocab_dir)
  try:
    if local is None:
      enc = tiktoken.get_encoding("gpt2")
    else:
      from tiktoken_ext import openai_public
      ranks = tiktoken_load.data_gym_to_mergeable_bpe_ranks(
          vocab_bpe_file=os.path.join(local, "vocab.bpe"),
          encoder_json_file=os.path.join(local, "encoder.json"),
          vocab_bpe_hash=GPT2_FILES["vocab.bpe"], encoder_json_hash=GPT2_FILES["encoder.json"])
      enc = tiktoken.Encoding("gpt2", pat_str=openai_public.r50k_pat_str, mergeable_ranks=ranks,
                              special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
  except Exception as e:  # noqa: BLE001 - no network, a missing or damaged file
    where = f"in {local}" if local else "from the network (offline?)"
    raise ValueError(
        f"GPT-2's BPE vocabulary could not be read {where} ({type(e).__name__}): put "
        f"vocab.bpe and encoder.json from {GPT2_URL} in $ATTNSCALE_DATA/gpt2/ (or "
        "--vocab_dir), or set TIKTOKEN_CACHE_DIR to a tiktoken cache made where there is "
        "network; --tokenizer=bytes needs no vocabulary") from None
  return LMTokenizer("gpt2", enc.n_vocab, enc.eot_token, enc.encode_ordinary, enc.decode)


def spm8k(model_file: str) -> LMTokenizer:
  """spm8k from its saved SentencePiece model file (`train_spm8k`'s).

  Raises:
    ValueError: no model file there; one line naming it.
  """
  from attnscale.data import tokenizer as tokenizer_lib  # sentencepiece: only when used
  if not os.path.isfile(model_file):
    raise ValueError(f"spm8k's model file {model_file} is not there: the shards' folder "
                     f"holds it ({SPM_MODEL_FILE}, written by attnscale.data.prepare_tokens)")
  tok = tokenizer_lib.Tokenizer.load(model_file)  # checks the specials' ids
  # [SEP] is a control piece: encoding text never produces it, so it marks only
  # the documents' boundaries.
  return LMTokenizer("spm8k", tok.vocab_size, tokenizer_lib.SEP_ID,
                     lambda text: tok.encode(text).tolist(), tok.decode)


def train_spm8k(documents: Iterable[str], model_file: str, *, seed: int = 0) -> LMTokenizer:
  """Trains spm8k's vocabulary on `documents`, saves it to `model_file`, loads it.

  SentencePiece trains on sentences: each document's non-empty lines, stripped (a
  line longer than 64 KiB is skipped). Deterministic: the same documents and seed
  give the same file (`attnscale.data.tokenizer.train`; the seed only draws a sample
  of a corpus of more than 2M lines).
  """
  from attnscale.data import tokenizer as tokenizer_lib
  lines = [line.strip() for doc in documents for line in doc.split("\n") if line.strip()]
  if not lines:
    raise ValueError("spm8k's training documents hold no text")
  tokenizer_lib.train(lines, vocab_size=SPM8K_PIECES, seed=seed).save(model_file)
  return spm8k(model_file)


TOKENIZERS: dict[str, Callable[..., LMTokenizer]] = {"gpt2": gpt2, "bytes": bytes_tokenizer,
                                                     "spm8k": spm8k}


def get(name: str, vocab_dir: str | None = None, *, model_file: str | None = None) -> LMTokenizer:
  """The tokenizer `name` (a key of `TOKENIZERS`); one-line ValueError otherwise.

  `vocab_dir`: GPT-2's local vocabulary (`gpt2`); `model_file`: spm8k's model.
  """
  if name not in TOKENIZERS:
    raise ValueError(f"--tokenizer must be one of {list(TOKENIZERS)}, got {name!r}")
  if name == "gpt2":
    return gpt2(vocab_dir)
  if name == "spm8k":
    if not model_file:
      raise ValueError("spm8k needs its model file (the shards' tokenizer.model)")
    return spm8k(model_file)
  return bytes_tokenizer()


def from_meta(meta: dict, data_dir: str) -> LMTokenizer:
  """The tokenizer of the shards in `data_dir` whose meta.json is `meta`: its name,
  and spm8k's model file by its path relative to `data_dir` (`tokenizer_model`)."""
  model = meta.get("tokenizer_model")
  return get(meta["tokenizer"], model_file=os.path.join(data_dir, model) if model else None)
