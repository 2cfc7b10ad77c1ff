"""TFDS builder for tiny Shakespeare, split by characters as nanoGPT does.

Same source file (and sha256) as TFDS's own `tiny_shakespeare`, which splits it
90/5/5; this builder uses the 90/10 train/validation split of nanoGPT's
data/shakespeare_char/prepare.py:

    n = len(data); train_data = data[:int(n*0.9)]; val_data = data[int(n*0.9):]

Each split is one example holding that split's whole text, so reading it back is
one record per split. Prepare with `file_format="array_record"` and read with
`builder.as_data_source()`: neither needs TensorFlow.
"""

from __future__ import annotations

import tensorflow_datasets as tfds

from attnscale.data import paths

TRAIN_FRACTION = 0.9


class TinyShakespeareChar(tfds.core.GeneratorBasedBuilder):
  """Tiny Shakespeare as text: 90% train, 10% validation, split by characters."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "nanoGPT shakespeare_char split: 90% / 10%."}

  URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
         "tinyshakespeare/input.txt")
  SIZE = 1115394
  SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
  RELPATH = "tinyshakespeare/input.txt"  # Under $ATTNSCALE_DATA.

  # TFDS looks for a checksums.tsv next to the builder's module; registering the
  # checksum in code instead keeps the size and sha256 in one place (also used
  # for the local copy) and needs no package data.
  @tfds.core.utils.classproperty
  @classmethod
  def url_infos(cls) -> dict[str, tfds.download.checksums.UrlInfo]:
    return {cls.URL: tfds.download.checksums.UrlInfo(
        size=cls.SIZE, checksum=cls.SHA256, filename="input.txt")}

  def local_sources(self) -> dict[str, str]:
    """{path under $ATTNSCALE_DATA: its URL} (`paths.check_sources`)."""
    return {self.RELPATH: self.URL}

  def _info(self) -> tfds.core.DatasetInfo:
    # An explicit DatasetInfo rather than dataset_info_from_configs(), which
    # would read any README.md or CITATIONS.bib that lands in this folder.
    return tfds.core.DatasetInfo(
        builder=self,
        description=(
            "Tiny Shakespeare (char-rnn input.txt), 90/10 train/validation "
            "split by characters as in nanoGPT's shakespeare_char."),
        features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
        homepage="https://github.com/karpathy/char-rnn",
        citation="Andrej Karpathy, char-rnn, 2015. https://github.com/karpathy/char-rnn",
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    path = paths.local_file(self.RELPATH, self.URL, self.SHA256)
    if path is None:
      paths.check_reachable(self.URL, self.RELPATH)  # offline: one line, in seconds
      path = dl_manager.download(self.URL)  # Checked against `url_infos`.
    # Bytes decoded as is: text mode would translate newlines.
    text = path.read_bytes().decode("utf-8")
    n = int(len(text) * TRAIN_FRACTION)
    return {
        "train": self._generate_examples(text[:n]),
        "validation": self._generate_examples(text[n:]),
    }

  def _generate_examples(self, text: str):
    yield 0, {"text": text}
