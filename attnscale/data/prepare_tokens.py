r"""Tokenizes text into token shards (`attnscale.data.tokens`): what configs/gpt2.py trains on.

  # A folder of .txt files (each one document) and .jsonl files (a "text" field a line):
  python -m attnscale.data.prepare_tokens --input=$ATTNSCALE_DATA/tinyshakespeare \
      --out=data/shakespeare_gpt2 --val_tokens=30000
  # A Hugging Face dataset, streamed (needs network and `pip install datasets`):
  python -m attnscale.data.prepare_tokens --hf_dataset=fineweb_edu_10b --out=data/fineweb_edu_10b
  python -m attnscale.data.prepare_tokens --hf_dataset=openwebtext --out=data/openwebtext
  # WikiText-2 with a SentencePiece vocabulary trained on its training articles (offline):
  python -m attnscale.data.prepare_tokens --input=$ATTNSCALE_DATA/wikitext-2 \
      --tokenizer=spm8k --out=data/wikitext2_spm8k

Each document becomes <|endoftext|> then its tokens (llm.c's fineweb.py: the
end-of-text id delimits documents). The first --val_tokens tokens of the stream are
the validation split (llm.c's first shard), the rest the training split. An input
shorter than twice that is split a tenth / nine tenths instead (said in one line).

A WikiText folder (--input holding train.txt and valid.txt, `attnscale.data.wikitext`'s
files) brings its own split instead: its articles are the documents (one each, from
its ` = Title = ` line on, text as is), train.txt's the training split and
valid.txt's the validation split; --val_tokens is unused and test.txt unread.
Chosen over a --val_input flag because the folder alone says both what to split
and where a document starts, and because reading such a folder as plain .txt files
would make test.txt (sorted first) the validation split and put valid.txt in training.

--format=llmc (default) writes llm.c's shards of --shard_tokens tokens each
(<name>_val_000000.bin, <name>_train_000001.bin, ...); --format=nanogpt writes
nanoGPT's train.bin and val.bin. meta.json records the tokenizer, vocabulary and
counts. --tokenizer=gpt2 (default) is GPT-2's BPE through tiktoken; offline it
needs a local copy of its vocabulary (the error says where); --tokenizer=bytes
needs none; --tokenizer=spm8k trains an 8192-piece SentencePiece BPE vocabulary
(`attnscale.data.lm_tokenizers`) on the training documents only, never on the
validation text, with --seed (deterministic), saves it as OUT/tokenizer.model and
names it in meta.json (`tokenizer_model`), so it needs an input with its own
validation split (a WikiText folder).
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Iterator

import numpy as np

from attnscale.data import lm_tokenizers, tokens

# Named Hugging Face datasets: name -> (path, config, text field).
HF_DATASETS = {
    "fineweb_edu_10b": ("HuggingFaceFW/fineweb-edu", "sample-10BT", "text"),
    "fineweb_10b": ("HuggingFaceFW/fineweb", "sample-10BT", "text"),
    "openwebtext": ("Skylion007/openwebtext", None, "text"),
}


def local_documents(path: str, text_field: str = "text") -> Iterator[str]:
  """The documents of a .txt / .jsonl file, or of every such file under a folder
  (sorted, so the shards are the same on every machine)."""
  if os.path.isdir(path):
    files = sorted(f for f in glob.glob(os.path.join(path, "**", "*"), recursive=True)
                   if f.endswith((".txt", ".jsonl")))
    if not files:
      raise ValueError(f"--input={path} holds no .txt or .jsonl file")
  elif os.path.isfile(path):
    files = [path]
  else:
    raise ValueError(f"--input={path} is neither a file nor a folder")
  for name in files:
    with open(name, encoding="utf-8") as f:
      if name.endswith(".txt"):
        yield f.read()
        continue
      for line in f:
        if line.strip():
          yield json.loads(line)[text_field]


def wikitext_files(path: str) -> dict[str, str] | None:
  """{split: file} when `path` is a WikiText folder (train.txt and valid.txt), else None."""
  from attnscale.data import wikitext
  files = {split: os.path.join(path, f"{wikitext.SPLITS[split]}.txt")
           for split in ("train", "validation")}
  return files if os.path.isdir(path) and all(map(os.path.isfile, files.values())) else None


def wikitext_documents(file: str) -> Iterator[str]:
  """The articles of a WikiText file (`attnscale.data.wikitext.articles`)."""
  from attnscale.data import wikitext
  with open(file, encoding="utf-8", newline="") as f:  # the bytes' own newlines
    yield from wikitext.articles(f.read())


def hf_documents(name: str) -> Iterator[str]:
  """The documents of a Hugging Face dataset (a key of HF_DATASETS or "path[:config]"),
  streamed: nothing but the tokens is kept on disk."""
  path, config, field = HF_DATASETS.get(name, (*name.partition(":")[::2], "text"))
  try:
    import datasets
  except ImportError:
    raise ValueError("--hf_dataset needs the datasets package: pip install datasets") from None
  stream = datasets.load_dataset(path, name=config or None, split="train", streaming=True)
  for row in stream:
    yield row[field]


_TOKENIZER = None  # each worker process's own


def _init_worker(name: str, vocab_dir: str | None, model_file: str | None) -> None:
  global _TOKENIZER
  _TOKENIZER = lm_tokenizers.get(name, vocab_dir, model_file=model_file)


def _encode(text: str) -> np.ndarray:
  return np.array([_TOKENIZER.eot, *_TOKENIZER.encode(text)], np.uint16)


def encoded(documents: Iterable[str], tokenizer: str, vocab_dir: str | None,
            workers: int, model_file: str | None = None) -> Iterator[np.ndarray]:
  """Each document's tokens (end-of-text first), in order; `workers` processes."""
  init = (tokenizer, vocab_dir, model_file)
  _init_worker(*init)  # this process encodes too when workers <= 1
  if workers <= 1:
    yield from map(_encode, documents)
    return
  with multiprocessing.get_context("spawn").Pool(
      workers, initializer=_init_worker, initargs=init) as pool:
    yield from pool.imap(_encode, documents, chunksize=16)


class ShardWriter:
  """Writes a split's tokens as they come: shards of `shard_tokens` (llmc) or one file
  (nanogpt)."""

  def __init__(self, out: str, name: str, fmt: str, shard_tokens: int):
    self.out, self.name, self.fmt, self.shard_tokens = out, name, fmt, shard_tokens
    self.index = 0  # llm.c numbers shards across splits: val 000000, train 000001...
    self.counts = {"train": 0, "validation": 0}
    self._buffer, self._split = [], None

  def add(self, split: str, tokens_: np.ndarray) -> None:
    if split != self._split:
      self.flush()
      self._split = split
    self._buffer.append(tokens_)
    self.counts[split] += len(tokens_)
    if self.fmt == "llmc":
      while sum(map(len, self._buffer)) >= self.shard_tokens:
        flat = np.concatenate(self._buffer)
        self._write(flat[:self.shard_tokens])
        self._buffer = [flat[self.shard_tokens:]]

  def flush(self) -> None:
    if self._split is not None and (sum(map(len, self._buffer)) or self.fmt == "nanogpt"):
      self._write(np.concatenate(self._buffer) if self._buffer else np.zeros(0, np.uint16))
    self._buffer = []

  def _write(self, flat: np.ndarray) -> None:
    short = tokens.SPLIT_NAMES[self._split]
    if self.fmt == "llmc":
      path = os.path.join(self.out, f"{self.name}_{short}_{self.index:06d}.bin")
      self.index += 1
      tokens.write_shard(path, flat, "llmc")
    else:  # nanoGPT's one file a split, appended to as tokens come
      path = os.path.join(self.out, f"{short}.bin")
      with open(path, "ab") as f:
        f.write(flat.astype("<u2").tobytes())


def prepare(documents: Iterable[str], out: str, *, tokenizer: str = "gpt2", fmt: str = "llmc",
            val_tokens: int = 100_000_000, shard_tokens: int = 100_000_000,
            name: str | None = None, vocab_dir: str | None = None, workers: int = 1,
            source: str = "", val_documents: Iterable[str] | None = None, seed: int = 0,
            log=print) -> dict:
  """Tokenizes `documents` into shards in `out`; returns (and writes) meta.json.

  The first `val_tokens` tokens are the validation split, the rest training; an
  input shorter than 2 x val_tokens is split 1/10 : 9/10. The split falls at a
  token, not between documents, as llm.c's shards do. Given `val_documents`, they
  are the validation split and `documents` the training split (val_tokens unused).
  spm8k (which needs `val_documents`) trains its vocabulary on `documents` with
  `seed` and saves it in `out`.
  """
  if fmt not in ("llmc", "nanogpt"):
    raise ValueError(f"--format must be one of ['llmc', 'nanogpt'], got {fmt!r}")
  if val_tokens <= 0 or shard_tokens <= 0:
    raise ValueError(f"--val_tokens and --shard_tokens must be > 0, got {val_tokens}, "
                     f"{shard_tokens}")
  trained = tokenizer == "spm8k"  # its vocabulary is made here, from the training split
  if trained and val_documents is None:
    raise ValueError("--tokenizer=spm8k needs an input with its own validation split (a "
                     "WikiText folder: train.txt, valid.txt), so that its vocabulary never "
                     "sees validation text")
  # A missing vocabulary fails before any work.
  tok = None if trained else lm_tokenizers.get(tokenizer, vocab_dir)
  os.makedirs(out, exist_ok=True)
  if glob.glob(os.path.join(out, "*.bin")):
    raise ValueError(f"--out={out} already holds .bin shards: use an empty folder")
  model_file = None
  if trained:
    documents = list(documents)  # read twice: the vocabulary's text, then the tokens
    model_file = os.path.join(out, lm_tokenizers.SPM_MODEL_FILE)
    start = time.perf_counter()
    tok = lm_tokenizers.train_spm8k(documents, model_file, seed=seed)
    log(f"trained {tokenizer}'s vocabulary ({tok.vocab_size} pieces) on the "
        f"{len(documents):,} training documents in {time.perf_counter() - start:.1f} s: "
        f"{model_file}")
  name = name or os.path.basename(os.path.normpath(out))
  writer = ShardWriter(out, name, fmt, shard_tokens)
  docs = 0
  if val_documents is not None:  # validation first: llm.c's shard 000000
    for doc in encoded(val_documents, tokenizer, vocab_dir, workers, model_file):
      docs += 1
      writer.add("validation", doc)
    head = None  # every training document goes to training
  else:
    head, head_len = [], 0  # the stream's first 2 x val_tokens, until its split is known
  for doc in encoded(documents, tokenizer, vocab_dir, workers, model_file):
    docs += 1
    if head is None:
      writer.add("train", doc)
      continue
    head.append(doc)
    head_len += len(doc)
    if head_len >= 2 * val_tokens:
      _write_head(writer, np.concatenate(head), val_tokens)
      head = None
    if docs % 10_000 == 0:
      log(f"{docs:,} documents, {sum(writer.counts.values()) + head_len:,} tokens")
  if head is not None:  # a small input: a tenth for validation
    flat = np.concatenate(head) if head else np.zeros(0, np.uint16)
    if len(flat) < 20:
      raise ValueError(f"the input has {len(flat)} tokens: too few to split")
    log(f"the input has {len(flat):,} tokens, fewer than 2 x --val_tokens: validation is "
        "its first tenth")
    _write_head(writer, flat, len(flat) // 10)
  writer.flush()
  meta = {"tokenizer": tokenizer, "vocab_size": tok.vocab_size, "eot": tok.eot, "format": fmt,
          "source": source, "documents": docs, "tokens": writer.counts}
  if trained:  # relative: the folder can move
    meta.update(tokenizer_model=lm_tokenizers.SPM_MODEL_FILE, tokenizer_seed=seed)
  with open(os.path.join(out, tokens.META_FILE), "w") as f:
    json.dump(meta, f, indent=2)
  log(f"wrote {out}: {writer.counts['train']:,} train and {writer.counts['validation']:,} "
      f"validation tokens ({tokenizer}, {fmt})")
  return meta


def _write_head(writer: ShardWriter, flat: np.ndarray, val_tokens: int) -> None:
  writer.add("validation", flat[:val_tokens])
  writer.add("train", flat[val_tokens:])


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m attnscale.data.prepare_tokens", description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  source = parser.add_mutually_exclusive_group(required=True)
  source.add_argument("--input", help="a .txt or .jsonl file, or a folder of them; a "
                      "WikiText folder (train.txt, valid.txt): its articles, split as its "
                      "files are")
  source.add_argument("--hf_dataset", help=f"{', '.join(HF_DATASETS)}, or a Hugging Face "
                      "dataset path[:config] with a 'text' column (streamed)")
  parser.add_argument("--out", required=True, help="the shards' folder (config.data_dir)")
  parser.add_argument("--tokenizer", default="gpt2", help="gpt2 (tiktoken) | bytes | spm8k "
                      "(a SentencePiece BPE vocabulary trained on the training split)")
  parser.add_argument("--vocab_dir", help="a folder with GPT-2's vocab.bpe and encoder.json "
                      "(offline; default $ATTNSCALE_DATA/gpt2 when there)")
  parser.add_argument("--format", default="llmc", help="llmc (llm.c's headed shards) | "
                      "nanogpt (train.bin, val.bin)")
  parser.add_argument("--val_tokens", type=int, default=100_000_000,
                      help="tokens of the validation split (the stream's first)")
  parser.add_argument("--shard_tokens", type=int, default=100_000_000,
                      help="tokens a shard (llmc)")
  parser.add_argument("--text_field", default="text", help=".jsonl: the field with the text")
  parser.add_argument("--name", help="the shards' file-name prefix (default: --out's name)")
  parser.add_argument("--seed", type=int, default=0, help="spm8k: the vocabulary's seed")
  parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                      help="tokenizing processes")
  args = parser.parse_args(argv)
  try:
    wikitext_split = wikitext_files(args.input) if args.input else None
    val_docs = None
    if wikitext_split:
      print(f"--input={args.input} is WikiText: the articles of {wikitext_split['train']} "
            f"for training, of {wikitext_split['validation']} for validation")
      docs = wikitext_documents(wikitext_split["train"])
      val_docs = wikitext_documents(wikitext_split["validation"])
    elif args.input:
      docs = local_documents(args.input, args.text_field)
    else:
      docs = hf_documents(args.hf_dataset)
    prepare(docs, args.out, tokenizer=args.tokenizer, fmt=args.format,
            val_tokens=args.val_tokens, shard_tokens=args.shard_tokens, name=args.name,
            vocab_dir=args.vocab_dir, workers=args.workers,
            source=args.input or f"hf:{args.hf_dataset}", val_documents=val_docs,
            seed=args.seed)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
