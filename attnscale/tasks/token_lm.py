"""Token-level language modelling on pre-tokenized shards: GPT-2 on OpenWebText / FineWeb.

The data is a folder of shards (`config.data_dir`, nanoGPT's or llm.c's format:
`attnscale.data.tokens`; `config.dataset` says which, or auto) made by
`python -m attnscale.data.prepare_tokens` or by nanoGPT's / llm.c's own scripts.
Training batches are random windows drawn from (seed, step), each process reading
only its rows; the periodic estimate is `eval_batches` fixed validation windows;
eval.py scores the first `config.eval_tokens` validation targets once (0, or
eval.py --whole_split: all of them). The loss is the mean next-token cross-entropy.
The model's vocabulary may be larger than the tokenizer's (GPT-2's 50257 padded to
50304, a multiple of 64, as nanoGPT does for speed); the extra ids are never targets.

Dimension legend: T sequence, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys

import jax

from attnscale.data import lm_tokenizers, tokens
from attnscale.fields import field
from attnscale.tasks.base import NextTokenTask, Sampler
from attnscale.tasks.char_lm import sample


@dataclasses.dataclass(frozen=True)
class TokenLMFields:
  """The token LM's own config fields."""

  eval_tokens: int = field(
      0, "validation targets eval.py scores: the split's first N (modded-nanogpt's "
      "10,485,760); 0 = the whole split (also eval.py --whole_split)", kind="bookkeeping")


class TokenLMTask(NextTokenTask):
  """Next-token prediction on the token shards in `config.data_dir`."""

  UNIT = "token"
  get_batch = staticmethod(tokens.get_batch)
  DATASETS = tokens.FORMATS  # config.dataset: the shards' format (auto reads each header)
  CONFIG_FIELDS = TokenLMFields

  @classmethod
  def validate_config(cls, config) -> None:
    super().validate_config(config)
    if config.eval_tokens < 0:
      raise ValueError(f"config.eval_tokens must be >= 0 (0 = the whole validation split), "
                       f"got {config.eval_tokens}")

  def __init__(self, config):
    super().__init__(config)
    self.data = tokens.load(config.data_dir, config.dataset)
    if config.model.vocab_size < self.data.vocab_size:
      raise ValueError(f"model.vocab_size ({config.model.vocab_size}) must be >= the "
                       f"vocabulary of the shards in {config.data_dir} "
                       f"({self.data.meta['tokenizer']}: {self.data.vocab_size}): set "
                       f"--config.model.vocab_size={-(-self.data.vocab_size // 64) * 64}")

  def eval_batches(self, batch_size: int | None = None):
    """Non-overlapping windows over the first `config.eval_tokens` validation
    targets (0: the whole split), every one of them once."""
    return tokens.eval_batches(
        self.data.validation, batch_size=batch_size or self.config.batch_size,
        seq_len=self.config.seq_len, max_tokens=self.config.eval_tokens,
        process_index=jax.process_index(), process_count=jax.process_count())

  def eval_metrics(self, sums):
    loss = sums["loss_sum"] / max(sums["count"], 1.0)
    return {"val_loss": loss, "perplexity": math.exp(min(loss, 700.0)),
            "val_tokens": int(sums["count"]),
            "val_split_tokens": int(len(self.data.validation) - 1),
            "tokenizer": self.data.meta["tokenizer"]}

  @classmethod
  def format_summary(cls, result):
    scored = ("all" if result["val_tokens"] == result["val_split_tokens"]
              else f"the first {result['val_tokens']:,} of")
    lines = [f"  validation loss {result['val_loss']:.4f} | perplexity "
             f"{result['perplexity']:.2f} over {scored} {result['val_split_tokens']:,} "
             f"validation targets ({result['tokenizer']} tokens)"]
    s = result.get("sample")
    if s:
      lines += [f"  sample (temperature {s['temperature']}, top-k {s['top_k']}, seed "
                f"{s['seed']}):", "  " + "-" * 60, s["prompt"] + s["text"], "  " + "-" * 60]
    return lines

  @functools.cached_property
  def sampler(self) -> Sampler | None:
    """Sampling with the shards' tokenizer (meta.json's; spm8k's model file beside
    the shards), or None (one line on stderr) when its vocabulary cannot be read
    here (GPT-2's, offline without a local copy)."""
    try:
      tok = lm_tokenizers.from_meta(self.data.meta, self.config.data_dir)
    except ValueError as e:
      print(f"warning: no sample: {e}", file=sys.stderr, flush=True)
      return None
    # A prompt that encodes to nothing (spm8k's "\n": it collapses whitespace) starts
    # from end-of-text, the token every training document starts with.
    encode = lambda text: tok.encode(text) or [tok.eot]
    # The model's padded ids past the tokenizer's (never targets) decode to nothing.
    decode = lambda ids: tok.decode([i for i in ids if i < tok.vocab_size])
    return functools.partial(sample, encode=encode, decode=decode)
