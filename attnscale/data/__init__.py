"""Data pipelines: TFDS builders read without TensorFlow, and batching.

`$ATTNSCALE_DATA` (see `paths`) makes every builder read local copies of its
source files instead of downloading them.
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
