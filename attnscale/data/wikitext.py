"""TFDS builder for WikiText (v1, tokenized) as paragraphs with subword ids.

WikiText (Merity et al. 2016, "Pointer Sentinel Mixture Models", arXiv
1609.07843): Wikipedia Good and Featured articles, one paragraph per line,
already word-tokenized (` , `, ` @-@ `, rare words as `<unk>`). Configs:
`wikitext2` (2.1M words), `wikitext2_2k` (the same with a 2048-piece
vocabulary instead of 8192) and `wikitext103` (103M words, same valid/test).

Examples are the paragraphs: every non-empty line that is not a heading
(` = Title = `, ` = = Section = = `). A paragraph is the unit of context the
corpus gives (articles are not marked beyond headings); splitting into
sentences would need a sentence splitter and would give mostly short examples,
while the MLM batcher (`attnscale.data.mlm`) cuts long paragraphs into
consecutive sequences and pads the short ones. The text is kept as is.
`articles` cuts a file into its articles instead (the token LM's documents:
`attnscale.data.prepare_tokens` on a WikiText folder).

Preparing also trains the tokenizer: a SentencePiece BPE vocabulary of
`vocab_size` pieces with BERT's specials, from the train split
(`attnscale.data.tokenizer`, deterministic for a given `tokenizer_seed`), saved
as `tokenizer.model` beside the prepared splits (written inside TFDS's
temporary directory, so it appears atomically with them), and stores every
paragraph's piece ids, so the corpus is tokenized exactly once.

Sources: with `$ATTNSCALE_DATA` set, `wikitext-2/{train,valid,test}.txt` under it
(sha256-checked; for wikitext-103 no local sha256 is known, so those files are
read unchecked); otherwise the canonical zip, sha256-checked after download.
Prepare with `file_format="array_record"`, read with `as_data_source()`: no
TensorFlow.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import zipfile

import numpy as np
import tensorflow_datasets as tfds

from attnscale.data import paths
from attnscale.data import tokenizer as tokenizer_lib

TOKENIZER_FILE = "tokenizer.model"  # the SentencePiece model, beside the splits
SPLITS = {"train": "train", "validation": "valid", "test": "test"}  # TFDS name -> file stem
_HEADING = re.compile(r"^(= )+.*?( =)+$")
_TITLE = re.compile(r"^= (?!= ).*(?<! =) =$")  # one "=" each side: an article's title


def paragraphs(text: str) -> list[str]:
  """The non-empty, non-heading lines of a WikiText file, stripped."""
  lines = (line.strip() for line in text.split("\n"))
  return [line for line in lines if line and not _HEADING.match(line)]


def articles(text: str) -> list[str]:
  """The articles of a WikiText file, each its text as is from its title line on.

  A title is a ` = Title = ` line (one "=" each side) between two blank lines:
  600 / 60 / 60 of them in WikiText-2's train / valid / test, the corpus's article
  counts (Merity et al. 2016). Lines shaped alike inside articles (an equation's
  `= 1 ... k =`, a table's `= Goals ; A =`) have text next to them. Text before the
  first title, if not blank, is an article too. The articles joined by "\n" are
  the text, less its blank lines before the first title.
  """
  lines = text.split("\n")
  blank = [not line.strip() for line in lines] + [True]  # past the end: blank
  starts = [i for i, line in enumerate(lines)
            if _TITLE.match(line.strip()) and (i == 0 or blank[i - 1]) and blank[i + 1]]
  bounds = [0, *starts, len(lines)]
  chunks = ("\n".join(lines[a:b]) for a, b in zip(bounds[:-1], bounds[1:]) if b > a)
  return [chunk for chunk in chunks if chunk.strip()]


@dataclasses.dataclass
class WikitextConfig(tfds.core.BuilderConfig):
  """One WikiText variant: where its files are and how big a vocabulary to train."""

  zip_url: str = ""
  zip_sha256: str | None = None
  zip_folder: str = ""  # folder inside the zip holding wiki.{split}.tokens
  local_folder: str = ""  # folder under $ATTNSCALE_DATA holding {train,valid,test}.txt
  local_sha256: dict[str, str | None] = dataclasses.field(default_factory=dict)
  vocab_size: int = 8192
  tokenizer_seed: int = 0  # only used to sample paragraphs from a corpus > 2M of them


def local_sources(cfg: WikitextConfig,
                  stems: tuple[str, ...] = tuple(SPLITS.values())) -> dict[str, str]:  # noqa: B008 (a constant)
  """{path under $ATTNSCALE_DATA: where it comes from} of `cfg`'s files."""
  return {f"{cfg.local_folder}/{stem}.txt": cfg.zip_url for stem in stems}


def source_texts(cfg: WikitextConfig, dl_manager,
                 stems: tuple[str, ...] = tuple(SPLITS.values())) -> dict[str, str]:  # noqa: B008 (a constant)
  """{file stem: text} of the given splits of `cfg`, local or downloaded, checked.

  Shared by the paragraph builder here and the character-level one
  (`attnscale.data.wikitext_char`), so both read the same checked bytes.
  """
  if paths.data_root() is not None:
    files = {stem: paths.local_file(f"{cfg.local_folder}/{stem}.txt", cfg.zip_url,
                                    cfg.local_sha256.get(stem))
             for stem in stems}
  else:
    # offline: one line, in seconds
    paths.check_reachable(cfg.zip_url, f"{cfg.local_folder}/{{{','.join(stems)}}}.txt")
    archive = dl_manager.download(cfg.zip_url)
    if cfg.zip_sha256 is not None and paths.sha256_of(archive) != cfg.zip_sha256:
      raise ValueError(f"sha256 mismatch for {archive} (from {cfg.zip_url}): expected "
                       f"{cfg.zip_sha256}, got {paths.sha256_of(archive)}")
    # Read from the zip directly: TFDS's extractor needs TensorFlow.
    with zipfile.ZipFile(archive) as z:
      return {stem: z.read(f"{cfg.zip_folder}/wiki.{stem}.tokens").decode("utf-8")
              for stem in stems}
  # Bytes decoded as is: text mode would translate newlines.
  return {stem: pathlib.Path(f).read_bytes().decode("utf-8") for stem, f in files.items()}


# WikiText-2's files, shared by its builder configs. The offline copy's (under
# $ATTNSCALE_DATA/wikitext-2) are byte-identical to pytorch/examples
# word_language_model/data/wikitext-2.
_WIKITEXT2_FILES = dict(
    zip_url="https://wikitext.smerity.com/wikitext-2-v1.zip",
    zip_sha256="92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c",
    zip_folder="wikitext-2", local_folder="wikitext-2",
    local_sha256={
        "train": "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f",
        "valid": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
        "test": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"})


class WikitextParagraphs(tfds.core.GeneratorBasedBuilder):
  """WikiText paragraphs with their subword ids; the tokenizer beside them."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Paragraphs (non-heading lines), SentencePiece BPE ids, 8192 pieces."}
  BUILDER_CONFIGS = [
      WikitextConfig(name="wikitext2", description="WikiText-2 v1 (tokenized, with <unk>).",
                     **_WIKITEXT2_FILES),
      # WikiText-2 again with a 2048-piece vocabulary: shorter pieces, each more
      # predictable from its neighbours, and a 4x smaller embedding; what
      # configs/bert_small.py's cpu preset trains on, so that a 10-minute run on 2
      # cores learns context instead of stopping near the unigram.
      WikitextConfig(name="wikitext2_2k",
                     description="WikiText-2 v1, a 2048-piece BPE vocabulary.",
                     vocab_size=2048, **_WIKITEXT2_FILES),
      WikitextConfig(
          name="wikitext103", description="WikiText-103 v1 (tokenized, with <unk>).",
          zip_url="https://wikitext.smerity.com/wikitext-103-v1.zip",
          zip_sha256="242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590",
          zip_folder="wikitext-103", local_folder="wikitext-103",
          # Not known for local copies: read unchecked (the zip is checked).
          local_sha256={"train": None, "valid": None, "test": None}),
  ]

  def local_sources(self) -> dict[str, str]:
    """{path under $ATTNSCALE_DATA: its URL} (`paths.check_sources`)."""
    return local_sources(self.builder_config)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=("WikiText paragraphs (non-empty, non-heading lines, text as is) with "
                     "the ids of a SentencePiece BPE vocabulary (BERT's specials) trained on "
                     "the train split."),
        features=tfds.features.FeaturesDict({
            "text": tfds.features.Text(),
            "ids": tfds.features.Tensor(shape=(None,), dtype=np.int32),
        }),
        homepage=("https://blog.salesforceairesearch.com/"
                  "the-wikitext-long-term-dependency-language-modeling-dataset/"),
        # Keep the corpus order (TFDS would shuffle examples by key hash).
        disable_shuffling=True,
        citation=("Stephen Merity, Caiming Xiong, James Bradbury, Richard Socher. "
                  "Pointer Sentinel Mixture Models. arXiv:1609.07843, 2016."),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    cfg = self.builder_config
    texts = {stem: paragraphs(t) for stem, t in source_texts(cfg, dl_manager).items()}
    tokenizer = tokenizer_lib.train(texts["train"], vocab_size=cfg.vocab_size,
                                    seed=cfg.tokenizer_seed)
    self.data_path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(self.data_path / TOKENIZER_FILE)  # inside TFDS's temporary dir
    return {split: self._generate_examples(texts[stem], tokenizer)
            for split, stem in SPLITS.items()}

  def _generate_examples(self, paras: list[str], tokenizer: tokenizer_lib.Tokenizer):
    for i, (text, ids) in enumerate(zip(paras, tokenizer.encode_batch(paras))):
      yield i, {"text": text, "ids": ids}
