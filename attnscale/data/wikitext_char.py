"""TFDS builder for WikiText-2 as characters: each split's file as one text.

The character-level counterpart of `tiny_shakespeare`: the same files the
paragraph builder reads (`wikitext.source_texts`, sha256-checked, local under
`$ATTNSCALE_DATA` or the v1 zip), kept byte for byte, headings, blank lines and
the corpus's own tokenization (` @-@ `, `<unk>`) included: a character model
sees exactly the file. The corpus's train and valid files are the train and
validation splits (about 10.8M and 1.1M characters, 283 distinct in all).

Each split is one example holding that split's whole text, so reading it back
is one record per split. Prepare with `file_format="array_record"` and read with
`builder.as_data_source()`: neither needs TensorFlow.
"""

from __future__ import annotations

import tensorflow_datasets as tfds

from attnscale.data import wikitext

SPLITS = {"train": "train", "validation": "valid"}  # TFDS split -> file stem


class Wikitext2Char(tfds.core.GeneratorBasedBuilder):
  """WikiText-2 (v1, tokenized) as text: the corpus's train and valid files."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "WikiText-2 v1 train/valid files as whole texts."}

  def local_sources(self) -> dict[str, str]:
    """{path under $ATTNSCALE_DATA: its URL} (`paths.check_sources`)."""
    cfg = wikitext.WikitextParagraphs.builder_configs["wikitext2"]
    return wikitext.local_sources(cfg, tuple(SPLITS.values()))

  def _info(self) -> tfds.core.DatasetInfo:
    # An explicit DatasetInfo, as tiny_shakespeare's: no README.md lookup.
    return tfds.core.DatasetInfo(
        builder=self,
        description="WikiText-2 v1 train and valid files, whole, for character-level LMs.",
        features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
        homepage=("https://blog.salesforceairesearch.com/"
                  "the-wikitext-long-term-dependency-language-modeling-dataset/"),
        citation=("Stephen Merity, Caiming Xiong, James Bradbury, Richard Socher. "
                  "Pointer Sentinel Mixture Models. arXiv:1609.07843, 2016."),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    # The paragraph builder's source definition: one place for URLs and sha256s.
    cfg = wikitext.WikitextParagraphs.builder_configs["wikitext2"]
    texts = wikitext.source_texts(cfg, dl_manager, stems=tuple(SPLITS.values()))
    return {split: self._generate_examples(texts[stem]) for split, stem in SPLITS.items()}

  def _generate_examples(self, text: str):
    yield 0, {"text": text}
