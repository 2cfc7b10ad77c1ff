"""Data pipelines: TFDS builders read without TensorFlow, and batching.

    paths.py           $ATTNSCALE_DATA: local copies of raw files, for machines offline
    tiny_shakespeare.py  TFDS builder: tiny Shakespeare split by characters (nanoGPT's)
    wikitext_char.py   TFDS builder: WikiText-2 as characters
    wikitext.py        TFDS builder: WikiText (v1, tokenized) as paragraphs of subword ids
    tokenizer.py       a ~8k SentencePiece BPE vocabulary with BERT's specials
    char_lm.py         character LM data: token streams, random windows, evaluation windows
    mlm.py             masked-LM data: padded [CLS] ... [SEP] rows, dynamic masking
    tokens.py          token-LM data: pre-tokenized shards (nanoGPT's, llm.c's), memory-mapped
    lm_tokenizers.py   the shards' tokenizers: GPT-2's BPE (tiktoken), bytes, spm8k
    prepare_tokens.py  text -> token shards (what configs/gpt2.py trains on)
    windows.py         training batches as random windows of one stream, for every task

May import checks, fields and core; nothing of the models or what trains them.
"""

from attnscale.data.char_lm import (
    CharDataset,
    eval_batches,
    get_batch,
    load_tiny_shakespeare,
    load_wikitext2_char,
)
from attnscale.data.mlm import load_wikitext
from attnscale.data.paths import data_root, local_file
from attnscale.data.tiny_shakespeare import TinyShakespeareChar
from attnscale.data.wikitext import WikitextParagraphs
from attnscale.data.wikitext_char import Wikitext2Char

__all__ = [
    "CharDataset",
    "TinyShakespeareChar",
    "Wikitext2Char",
    "WikitextParagraphs",
    "data_root",
    "eval_batches",
    "get_batch",
    "load_tiny_shakespeare",
    "load_wikitext2_char",
    "load_wikitext",
    "local_file",
]
