"""The tokenizers of token shards: GPT-2's BPE (tiktoken) and bytes.

    gpt2   GPT-2's byte-level BPE, 50257 ids, <|endoftext|> = 50256: what nanoGPT's
           and llm.c's shards hold. tiktoken fetches its two vocabulary files once
           (then caches them); offline it reads them from a local copy (`gpt2`).
    bytes  UTF-8 bytes 0..255 and an end-of-text id 256: no vocabulary file, so it
           works anywhere (the tests' shards, a CPU run without network).

A tokenizer is named in the shards' meta.json, so the task that trains on them
can decode a sample.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
GPT2_FILES = {"vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
              "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"}
VOCAB_DIR_ENV = "ATTNSCALE_DATA"  # a local copy under $ATTNSCALE_DATA/gpt2/ (attnscale.data.paths)


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


TOKENIZERS: dict[str, Callable[..., LMTokenizer]] = {"gpt2": gpt2, "bytes": bytes_tokenizer}


def get(name: str, vocab_dir: str | None = None) -> LMTokenizer:
  """The tokenizer `name` (a key of `TOKENIZERS`); one-line ValueError otherwise."""
  if name not in TOKENIZERS:
    raise ValueError(f"--tokenizer must be one of {list(TOKENIZERS)}, got {name!r}")
  return gpt2(vocab_dir) if name == "gpt2" else TOKENIZERS[name]()
