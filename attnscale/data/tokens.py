"""Token-LM data: pre-tokenized shards on disk, memory-mapped, read as random windows.

Two formats, the ones GPT-2 reproductions leave on disk (`FORMATS`):

    nanogpt  nanoGPT's data/openwebtext/prepare.py: train.bin and val.bin, headerless
             uint16 tokens.
    llmc     llm.c's and modded-nanogpt's shards (dev/data/data_common.py):
             <name>_val_000000.bin, <name>_train_000001.bin, ...; a header of 256
             int32 (magic 20240520, version 1, token count, zeros), then uint16 tokens.

A split is every file of the folder whose name holds "train" (or "val"), in name
order, read as one stream (`TokenStream`): llm.c cuts one token stream into shards,
so a window may span two of them. Nothing is loaded: each file is an `np.memmap`
and a batch reads only its own windows, so a process of a multi-host run touches
only its rows of the global batch.

Training batches are nanoGPT's: `batch_size` random windows x = tokens[i:i+T],
y = tokens[i+1:i+T+1], here at offsets drawn from `np.random.default_rng([seed,
step])`, so a resumed (or killed and rerun) run reads exactly the windows an
uninterrupted one would, and every process draws the same global offsets. Windows
are drawn with replacement, as nanoGPT's: a run over as many tokens as the corpus
holds reads about 63% of them (1 - 1/e), some more than once.

`meta.json` beside the shards (written by `attnscale.data.prepare_tokens`) names
their tokenizer and vocabulary; shards without one are taken for GPT-2's.

Dimension legend: G global batch (all processes), B this process's rows,
T sequence length.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Iterator

import numpy as np

from attnscale.data import windows

FORMATS = ("auto", "nanogpt", "llmc")  # config.dataset for task token_lm
LLMC_MAGIC, LLMC_VERSION = 20240520, 1  # llm.c's GPT-2 shards (uint16 tokens)
HEADER_INTS = 256
SPLIT_NAMES = {"train": "train", "validation": "val"}  # split -> what its file names hold
META_FILE = "meta.json"
GPT2_META = {"tokenizer": "gpt2", "vocab_size": 50257, "eot": 50256}  # shards without meta.json


def write_shard(path: str, tokens, fmt: str) -> None:
  """Writes `tokens` (ints in [0, 65536)) as one shard of format `fmt` (nanogpt | llmc)."""
  tokens = np.asarray(tokens)
  if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
    raise ValueError(f"token ids must fit uint16 ([0, 65536)), got [{tokens.min()}, "
                     f"{tokens.max()}]")
  with open(path + ".tmp", "wb") as f:
    if fmt == "llmc":
      header = np.zeros(HEADER_INTS, np.int32)
      header[:3] = LLMC_MAGIC, LLMC_VERSION, tokens.size
      f.write(header.tobytes())
    elif fmt != "nanogpt":
      raise ValueError(f"shard format must be one of ['nanogpt', 'llmc'], got {fmt!r}")
    f.write(tokens.astype("<u2").tobytes())
  os.replace(path + ".tmp", path)  # a killed writer leaves no half shard under the real name


def _has_llmc_header(path: str) -> bool:
  # A headerless GPT-2 shard cannot start with the magic: as two uint16 tokens it is
  # (54520, 308), and 54520 is past GPT-2's 50257 ids.
  with open(path, "rb") as f:
    first = f.read(4)
  return len(first) == 4 and int(np.frombuffer(first, "<i4")[0]) == LLMC_MAGIC


def read_shard(path: str, fmt: str = "auto") -> np.ndarray:
  """The uint16 tokens of one shard, memory-mapped (read-only; nothing is loaded).

  Args:
    path: the shard's file.
    fmt: nanogpt (headerless), llmc (llm.c's header, checked), or auto (llmc when
      the file starts with llm.c's magic number, else nanogpt).

  Raises:
    ValueError: a header that is not llm.c's GPT-2 one (magic, version), a token
      count that disagrees with the file's size, or a headerless file of odd size.
  """
  if fmt not in FORMATS:
    raise ValueError(f"shard format must be one of {list(FORMATS)}, got {fmt!r}")
  size = os.path.getsize(path)
  if fmt == "auto":
    fmt = "llmc" if _has_llmc_header(path) else "nanogpt"
  if fmt == "nanogpt":
    if size % 2:
      raise ValueError(f"{path}: {size} bytes is not a whole number of uint16 tokens (a "
                       "nanoGPT .bin file is headerless uint16)")
    return np.memmap(path, dtype="<u2", mode="r") if size else np.zeros(0, np.uint16)
  header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
  if len(header) < HEADER_INTS or header[0] != LLMC_MAGIC:
    raise ValueError(f"{path}: no llm.c header (magic {LLMC_MAGIC} in the first of 256 "
                     "int32): a nanoGPT file? use config.dataset=nanogpt or auto")
  if header[1] != LLMC_VERSION:
    raise ValueError(f"{path}: llm.c header version {header[1]}, expected {LLMC_VERSION} "
                     "(GPT-2's uint16 tokens; version 7 is llama-3's uint32, not read here)")
  count = int(header[2])
  if size != 4 * HEADER_INTS + 2 * count:
    raise ValueError(f"{path}: the header says {count} tokens but the file holds "
                     f"{(size - 4 * HEADER_INTS) / 2:g} (a truncated shard?)")
  return np.memmap(path, dtype="<u2", mode="r", offset=4 * HEADER_INTS, shape=(count,))


def shard_files(data_dir: str, split: str) -> list[str]:
  """The .bin files of `split` (train | validation) in `data_dir`, in name order."""
  pattern = os.path.join(data_dir, f"*{SPLIT_NAMES[split]}*.bin")
  return sorted(glob.glob(pattern))


class TokenStream:
  """The shards of one split as one token stream; `read` copies only what it asks for."""

  def __init__(self, shards: list[np.ndarray], names: list[str] = ()):
    self.shards = [s for s in shards if len(s)]
    self.names = list(names)
    # offsets[i] is where shard i starts in the stream; offsets[-1] its length.
    self.offsets = np.cumsum([0] + [len(s) for s in self.shards])

  def __len__(self) -> int:
    return int(self.offsets[-1])

  def read(self, start: int, length: int) -> np.ndarray:
    """tokens[start:start + length] of the stream as int32, across shard boundaries."""
    if start < 0 or start + length > len(self):
      raise ValueError(f"[{start}, {start + length}) is outside the stream's "
                       f"{len(self)} tokens")
    out = np.empty(length, np.int32)
    i = int(np.searchsorted(self.offsets, start, side="right")) - 1
    done = 0
    while done < length:
      lo = start + done - int(self.offsets[i])
      piece = self.shards[i][lo:lo + length - done]
      out[done:done + len(piece)] = piece
      done += len(piece)
      i += 1
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class TokenShards:
  """The train and validation streams of a shard folder, and its meta.json."""

  train: TokenStream
  validation: TokenStream
  meta: dict

  @property
  def vocab_size(self) -> int:
    return int(self.meta["vocab_size"])


def load(data_dir: str | None, fmt: str = "auto") -> TokenShards:
  """The shards in `data_dir`, memory-mapped.

  Raises:
    ValueError: no data_dir, no folder there, or a split without shards; one line
      naming config.data_dir and the command that makes shards.
  """
  make = ("python -m attnscale.data.prepare_tokens --out=DIR ... (docs/guides/gpt2.md), "
          "then --config.data_dir=DIR")
  if not data_dir:
    raise ValueError(f"config.data_dir must be a folder of token shards: {make}")
  if not os.path.isdir(data_dir):
    raise ValueError(f"config.data_dir={data_dir} is not a folder: {make}")
  streams = {}
  for split, name in SPLIT_NAMES.items():
    files = shard_files(data_dir, split)
    if not files:
      raise ValueError(f"config.data_dir={data_dir} has no {name} shards (*{name}*.bin): "
                       f"{make}")
    streams[split] = TokenStream([read_shard(f, fmt) for f in files], files)
  meta = dict(GPT2_META)
  if os.path.exists(os.path.join(data_dir, META_FILE)):
    with open(os.path.join(data_dir, META_FILE)) as f:
      meta.update(json.load(f))
  return TokenShards(streams["train"], streams["validation"], meta)


def get_batch(stream: TokenStream, *, batch_size: int, seq_len: int, seed: int, step: int,
              process_index: int = 0,
              process_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """This process's rows of the global random-window batch for `step`.

  The global batch is `batch_size` windows at offsets drawn by
  `np.random.default_rng([seed, step])`, uniform over [0, len - seq_len)
  (`attnscale.data.windows.window_starts`, as `char_lm.get_batch`'s); process p
  reads only rows [p * B, (p + 1) * B), B = batch_size // process_count.

  Returns:
    (inputs_BxT, targets_BxT), int32, targets = inputs shifted left by one.
  """
  if len(stream) < seq_len + 1:
    raise ValueError(f"the split has {len(stream)} tokens, fewer than seq_len + 1 = "
                     f"{seq_len + 1}")
  starts_B = windows.window_starts(len(stream), batch_size=batch_size, seq_len=seq_len,
                                   seed=seed, step=step, process_index=process_index,
                                   process_count=process_count)
  window_BxT1 = np.stack([stream.read(int(s), seq_len + 1) for s in starts_B])
  return window_BxT1[:, :-1], window_BxT1[:, 1:]


def num_eval_targets(stream: TokenStream, max_tokens: int = 0) -> int:
  """How many targets `eval_batches` scores: the first `max_tokens` (0: all)."""
  targets = len(stream) - 1
  return min(targets, max_tokens) if max_tokens else targets


def eval_batches(stream: TokenStream, *, batch_size: int, seq_len: int, max_tokens: int = 0,
                 process_index: int = 0,
                 process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
  """Non-overlapping windows over the first `max_tokens` targets (0: the whole split).

  Window k has inputs tokens[kT:kT+T] and targets tokens[kT+1:kT+T+1], each target
  predicted once, as `char_lm.eval_batches`; the tail and the last batch's missing
  rows are token 0 with weight 0, so every batch has one shape. Each process reads
  only its rows (p: [p * B, (p + 1) * B) of every global batch).

  Yields:
    {"inputs", "targets": [B, T] int32, "weights": [B, T] float32}.
  """
  if batch_size % process_count:
    raise ValueError(f"batch_size={batch_size} must be divisible by "
                     f"process_count={process_count}")
  num_targets = num_eval_targets(stream, max_tokens)
  if num_targets < 1:
    raise ValueError(f"the validation split has {len(stream)} tokens: at least 2 needed")
  num_windows = -(-num_targets // seq_len)
  num_batches = -(-num_windows // batch_size)
  B = batch_size // process_count
  for b in range(num_batches):
    inputs = np.zeros((B, seq_len), np.int32)
    targets = np.zeros((B, seq_len), np.int32)
    weights = np.zeros((B, seq_len), np.float32)
    for r in range(B):
      start = (b * batch_size + process_index * B + r) * seq_len
      n = min(seq_len, num_targets - start)  # the targets this window scores
      if n <= 0:
        break
      window = stream.read(start, n + 1)
      inputs[r, :n], targets[r, :n], weights[r, :n] = window[:-1], window[1:], 1.0
    yield {"inputs": inputs, "targets": targets, "weights": weights}
