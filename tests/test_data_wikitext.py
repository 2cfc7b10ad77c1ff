"""WikiText pipeline: TFDS builder without TensorFlow, subword tokenizer, checks.

Most tests use the session's synthetic WikiText (tests/conftest.py) through the
real builder; the real WikiText-2 test needs $ATTNSCALE_DATA and is `slow`.
Nothing touches the network.
"""

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from attnscale.data import mlm, paths, tokenizer, wikitext
from attnscale.testing import serve_directory

REPO = pathlib.Path(__file__).resolve().parents[1]

# Prepares in a fresh interpreter (so no other test can have imported TF first),
# with the synthetic files read unchecked as in the conftest fixture.
_PREPARE = """
import json, sys
from attnscale.data import mlm, wikitext
cfg = wikitext.WikitextParagraphs.builder_configs["wikitext2"]
cfg.local_sha256 = {k: None for k in cfg.local_sha256}
corpus = mlm.load_wikitext(sys.argv[1])
print(json.dumps({"tensorflow_imported": "tensorflow" in sys.modules,
                  "vocab_size": corpus.tokenizer.vocab_size}))
"""


def prepared_path(data_dir):
  return pathlib.Path(data_dir) / "wikitext_paragraphs" / "wikitext2" / "1.0.0"


def test_paragraphs_drop_headings_and_blank_lines():
  text = " = Title = \n\n = = Section = = \n First para , with <unk> . \n \n = = = Deep = = = \n Second \n"
  assert wikitext.paragraphs(text) == ["First para , with <unk> .", "Second"]
  # An "=" inside a paragraph is text, not a heading.
  assert wikitext.paragraphs(" x = y \n") == ["x = y"]


def test_prepares_array_record_without_tensorflow(synthetic_wikitext, tmp_path):
  root, data_dir = synthetic_wikitext
  env = dict(os.environ, PYTHONPATH=str(REPO), **{paths.ENV_VAR: str(root)})
  proc = subprocess.run([sys.executable, "-c", _PREPARE, str(tmp_path)], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert report["tensorflow_imported"] is False
  files = sorted(p.name for p in prepared_path(tmp_path).iterdir())
  for split in ("train", "validation", "test"):
    assert f"wikitext_paragraphs-{split}.array_record-00000-of-00001" in files
  assert wikitext.TOKENIZER_FILE in files  # the vocabulary lives beside the splits
  # Trained in another process, the vocabulary file is byte-identical.
  same = (prepared_path(tmp_path) / wikitext.TOKENIZER_FILE).read_bytes()
  assert same == (prepared_path(data_dir) / wikitext.TOKENIZER_FILE).read_bytes()


def test_examples_are_the_paragraphs_with_their_ids(synthetic_wikitext):
  root, data_dir = synthetic_wikitext
  corpus = mlm.load_wikitext(data_dir, splits=("train", "validation", "test"))
  tok = corpus.tokenizer
  for split, stem in wikitext.SPLITS.items():
    paras = wikitext.paragraphs((root / "wikitext-2" / f"{stem}.txt").read_text("utf-8"))
    offsets = corpus.offsets[split]
    assert len(offsets) == len(paras) + 1  # one example per paragraph, in file order
    for i in (0, len(paras) // 2, len(paras) - 1):
      ids = corpus.ids[split][offsets[i]:offsets[i + 1]]
      np.testing.assert_array_equal(ids, tok.encode(paras[i]))
      assert tok.decode(ids) == tok.normalize(paras[i])
  assert corpus.ids["train"].dtype == np.int32


def test_tokenizer_specials_and_markers(synthetic_wikitext):
  _, data_dir = synthetic_wikitext
  tok = mlm.load_wikitext(data_dir, splits=()).tokenizer
  assert tok.pieces[:9] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                            "<unk>", "@-@", "@,@", "@.@"]
  assert (tokenizer.PAD_ID, tokenizer.CLS_ID, tokenizer.SEP_ID, tokenizer.MASK_ID) == (0, 2, 3, 4)
  # WikiText's markers are single pieces, whatever surrounds them.
  ids = list(tok.encode("a <unk> , 1 @,@ 000 well @-@ known 3 @.@ 5"))
  for i in range(5, 9):
    assert ids.count(i) == 1
  assert all(0 <= i < tok.vocab_size for i in ids) and tokenizer.UNK_ID not in ids


ROUND_TRIP_TEXTS = [
    "The Café , a <unk> @-@ based band ( 1 @,@ 000 fans ) .",
    "They recorded 3 @.@ 5 albums ; \" Hello \" was released in 1999 !",
    "Ｆｕｌｌ width and  double  spaces ; MIXED Case",
]


def test_tokenizer_round_trip():
  tok = tokenizer.train(ROUND_TRIP_TEXTS * 20, vocab_size=120)
  for text in ROUND_TRIP_TEXTS:
    assert tok.decode(tok.encode(text)) == tok.normalize(text)
  # NFKC, case-folded, whitespace collapsed; WikiText's markers kept.
  assert tok.normalize(ROUND_TRIP_TEXTS[0]) == "the café , a <unk> @-@ based band ( 1 @,@ 000 fans ) ."
  assert tok.normalize(ROUND_TRIP_TEXTS[2]) == "full width and double spaces ; mixed case"
  # Specials decode to nothing.
  ids = tok.encode(ROUND_TRIP_TEXTS[0])
  padded = [tokenizer.CLS_ID, *ids, tokenizer.SEP_ID, tokenizer.PAD_ID, tokenizer.PAD_ID]
  assert tok.decode(padded) == tok.normalize(ROUND_TRIP_TEXTS[0])


def test_tokenizer_deterministic(tmp_path):
  texts = [f"word{i % 37} thing{i % 11}s and more words , number {i}" for i in range(400)]
  a, b = tokenizer.train(texts, vocab_size=300), tokenizer.train(texts, vocab_size=300)
  a.save(tmp_path / "a.model")
  b.save(tmp_path / "b.model")
  assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
  assert tokenizer.Tokenizer.load(tmp_path / "a.model").pieces == a.pieces
  with pytest.raises(ValueError, match="vocab_size must be > 9"):
    tokenizer.train(texts, vocab_size=9)


def test_missing_file_error_says_where_to_put_it(monkeypatch, tmp_path):
  monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "empty"))
  expected = str(tmp_path / "empty" / "wikitext-2" / "train.txt")
  with pytest.raises(FileNotFoundError, match=re.escape(expected)) as err:
    mlm.load_wikitext(str(tmp_path / "tfds"))
  assert "wikitext-2-v1.zip" in str(err.value)
  assert not (tmp_path / "tfds" / "wikitext_paragraphs" / "wikitext2" / "1.0.0").exists()


def test_production_path_checks_sha256(monkeypatch, tmp_path):
  folder = tmp_path / "root" / "wikitext-2"
  folder.mkdir(parents=True)
  for stem in ("train", "valid", "test"):
    (folder / f"{stem}.txt").write_text(" not the real corpus \n")
  monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "root"))
  with pytest.raises(ValueError, match=f"sha256 mismatch for {re.escape(str(folder))}"):
    mlm.load_wikitext(str(tmp_path / "tfds"))


def test_download_path_extracts_zip_and_checks_sha256(monkeypatch, tmp_path,
                                                     synthetic_wikitext):
  """The online branch, served from localhost: the v1 zip layout, then a bad sha256."""
  root, _ = synthetic_wikitext
  served = tmp_path / "served"
  served.mkdir()
  with zipfile.ZipFile(served / "wikitext-2-v1.zip", "w") as z:
    for stem in ("train", "valid", "test"):
      z.write(root / "wikitext-2" / f"{stem}.txt", f"wikitext-2/wiki.{stem}.tokens")
  sha256 = hashlib.sha256((served / "wikitext-2-v1.zip").read_bytes()).hexdigest()
  with serve_directory(served) as url:
    monkeypatch.delenv(paths.ENV_VAR, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    cfg = wikitext.WikitextParagraphs.builder_configs["wikitext2"]
    monkeypatch.setattr(cfg, "zip_url", f"{url}/wikitext-2-v1.zip")
    monkeypatch.setattr(cfg, "zip_sha256", sha256)
    corpus = mlm.load_wikitext(str(tmp_path / "ok"))
    paras = wikitext.paragraphs((root / "wikitext-2" / "valid.txt").read_text("utf-8"))
    assert len(corpus.offsets["validation"]) == len(paras) + 1
    monkeypatch.setattr(cfg, "zip_sha256", "0" * 64)
    with pytest.raises(ValueError, match="sha256 mismatch for .*wikitext-2-v1.zip"):
      mlm.load_wikitext(str(tmp_path / "bad"))


def test_unknown_dataset_name():
  with pytest.raises(ValueError, match=r"config.dataset must be one of \['wikitext2', "
                     r"'wikitext2_2k', 'wikitext103'\], got 'wikitext3'"):
    mlm.load_wikitext(None, "wikitext3")


@pytest.mark.slow
def test_real_wikitext2(tmp_path):
  """The real corpus: paragraph counts, an 8192-piece vocabulary, real padding."""
  if not os.environ.get(paths.ENV_VAR):
    pytest.skip(f"needs {paths.ENV_VAR} (CI sets it) or network access")
  corpus = mlm.load_wikitext(str(tmp_path))
  assert corpus.tokenizer.vocab_size == 8192
  assert len(corpus.offsets["train"]) - 1 == 17556
  assert len(corpus.offsets["validation"]) - 1 == 1841
  rows = mlm.make_rows(corpus.ids["train"], corpus.offsets["train"], 128)
  padding = 1 - (rows.length + 2).sum() / (len(rows) * 128)
  assert 0.2 < padding < 0.5  # padding really occurs (0.33)
