"""Every estimate with an interval on a study page tied to the table cell it comes from.

A study page (docs/experiments/*.md) and the README quote numbers from the tables
each study's command regenerates from its store (docs/results/<study>/*.md, or a
.csv beside them). A quoted number says where it comes from with a marker written
right after it, invisible in the rendered page:

    +0.260 [+0.028, +0.491]<!-- cell: normalisers/normalisers_bert_claims.md,
        row=gate_elementwise & val_loss, col=difference -->

  file  a table under docs/results, .md or .csv (the first table in it with that
        column);
  row   the one row in which every `&`-separated term is a whole cell;
  col   the column's header, or three headers `est/lo/hi` where the table keeps
        an interval's ends in columns of their own (`val_loss/val_lo/val_hi`);
  flags after the column, comma-separated: `neg` (the page prints -cell, its
        interval's ends swapped: "0.231 [0.107, 0.356] below it"), `n=2` (the
        cell's second estimate-with-interval, for a cell that holds several),
        `verdict=WORD` (below), `higher` (the measure is higher-is-better, as
        accuracy: the verdict is `Comparison.read(higher_is_better=True)`'s).

The check (`check_page`) then holds that:
  * each tied number equals its cell at the page's printed precision (|page -
    cell| <= half a unit in the page's last printed digit, the estimate and both
    ends), so a number copied from a neighbouring row or column fails;
  * every estimate with an interval outside code blocks is tied: "x [lo, hi]"
    with no marker after it is an error, and so is an interval with no estimate
    beside it ("0.27 nats below [0.12, 0.43]"); a page's notes on what earlier
    tables said sit under `<!-- superseded: ... -->` (to the next heading), and a
    page table that a study's own test regenerates and compares verbatim follows
    `<!-- generated: that test -->`: intervals in either are not checked here;
  * a verdict word the marker is given (`verdict=better`), or that follows the
    marker in its clause ("...]<!-- ... -->: worse"), is the word
    `stats.Comparison.read` gives the cell's interval, so a sentence's "better"
    cannot outlive the interval it rests on.

An interval that no table holds (a comparison the study's command does not yet
write) may instead be followed by `<!-- untied: what it is -->`: it is then listed
(`untied`), not an error, and tests/test_page_numbers.py holds their count to a
budget that may only fall. A marker that follows a bare number (no interval) ties that number to the cell's
first number in the same way. Numbers without intervals and without markers (a
count of runs, a date, a rate) are not checked.

    python -m attnscale.experiments.page_check             # every page and the README
    python -m attnscale.experiments.page_check --suggest docs/experiments/x.md
                                                           # candidate cells of untied numbers
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import math
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"

_NUM = r"[+\-−]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:e[+\-−]?\d+)?"
# An estimate with its interval: "x [lo, hi]", x optional where a cell holds "[lo, hi]".
INTERVAL_RE = re.compile(
    r"(?<![\w.])(?P<est>[+\-−]?\d[\d,]*(?:\.\d+)?(?:e[+\-−]?\d+)?)%?\s*"
    r"\[\s*(?P<lo>[+\-−]?\d[\d,]*(?:\.\d+)?(?:e[+\-−]?\d+)?)\s*,\s*"
    r"(?P<hi>[+\-−]?\d[\d,]*(?:\.\d+)?(?:e[+\-−]?\d+)?)\s*\]")
BARE_RE = re.compile(r"(?<![\w.])(?P<est>[+\-−]?\d[\d,]*(?:\.\d+)?(?:e[+\-−]?\d+)?)%?\s*$")
MARKER_RE = re.compile(r"<!--\s*cell:\s*(?P<body>.*?)\s*-->", re.S)
UNTIED_RE = re.compile(r"\s*<!--\s*untied:.*?-->", re.S)
COMMENT_RE = re.compile(r"<!--.*?-->", re.S)
# An interval with no estimate beside it ("0.27 nats below it [0.12, 0.43]"): the check
# cannot tie what it cannot read, so it asks for "x [lo, hi]".
BARE_INTERVAL_RE = re.compile(r"\[\s*[+\-−]?\d[\d,]*(?:\.\d+)?\s*,\s*[+\-−]?\d[\d,]*(?:\.\d+)?\s*\]")
# A section that records what earlier tables said (a page's re-read notes): from this
# marker to the next heading, intervals quote superseded tables and are not checked.
SUPERSEDED_RE = re.compile(r"<!--\s*superseded:.*?-->.*?(?=^#|\Z)", re.S | re.M)
# A page table that a study's own test prints and compares with the page byte for byte
# (the transfer page's glance table, tests/test_transfer_study.py): the marker on the line
# before it names that test; its cells are checked there, not here.
GENERATED_RE = re.compile(r"<!--\s*generated:.*?-->[ \t]*\n(?:\|[^\n]*\n)+", re.S)
FENCE_RE = re.compile(r"^```.*?^```", re.S | re.M)
VERDICTS = ("better", "worse", "within noise")


def _float(text: str) -> float:
  return float(text.replace("−", "-").replace(",", ""))


def _half_ulp(text: str) -> float:
  """Half a unit in the last printed digit of `text` ("0.04" -> 0.005)."""
  text = text.replace("−", "-").replace(",", "").lstrip("+-")
  mantissa, _, exponent = text.lower().partition("e")
  decimals = len(mantissa.partition(".")[2])
  return 0.5 * 10.0 ** (-decimals + (int(exponent) if exponent else 0))


@dataclasses.dataclass(frozen=True)
class Quote:
  """A number (with its interval, if any) as printed, and where."""

  est: str
  lo: str | None
  hi: str | None
  line: int
  text: str  # as printed
  end: int = -1  # offset just past it in the page

  def values(self) -> tuple[str, ...]:
    return (self.est,) if self.lo is None else (self.est, self.lo, self.hi)


@dataclasses.dataclass(frozen=True)
class Marker:
  file: str
  row: tuple[str, ...]
  col: str
  neg: bool = False
  nth: int = 1
  verdict: str | None = None
  higher: bool = False


def parse_marker(body: str) -> Marker:
  """`file, row=a & b, col=name[, neg][, n=2][, verdict=worse]` (module docstring)."""
  m = re.fullmatch(r"(?P<file>[^,]+?)\s*,\s*row=(?P<row>.+?)\s*,\s*col=(?P<rest>.+)", body, re.S)
  if not m:
    raise ValueError(f"marker {body!r}: expected 'FILE, row=..., col=...'")
  col, *flags = [p.strip() for p in m["rest"].split(",")]
  # A column name may itself hold a comma: rejoin what is not a flag.
  while flags and not re.fullmatch(r"neg|higher|n=\d+|verdict=.+", flags[0]):
    col += ", " + flags.pop(0)
  neg, nth, verdict, higher = False, 1, None, False
  for f in flags:
    if f == "neg":
      neg = True
    elif f == "higher":
      higher = True
    elif f.startswith("n="):
      nth = int(f[2:])
    elif f.startswith("verdict="):
      verdict = f[len("verdict="):]
      if verdict not in VERDICTS:
        raise ValueError(f"marker {body!r}: verdict must be one of {VERDICTS}, got {verdict!r}")
    else:
      raise ValueError(f"marker {body!r}: unknown flag {f!r} (neg, higher, n=K, verdict=WORD)")
  return Marker(m["file"].strip(), tuple(t.strip() for t in m["row"].split("&")), col, neg,
                nth, verdict, higher)


# ---------------------------------------------------------------------------
# Tables.

def _cells(line: str) -> list[str]:
  line = line.strip()
  if line.startswith("|"):
    line = line[1:]
  if line.endswith("|"):
    line = line[:-1]
  return [c.strip() for c in re.split(r"(?<!\\)\|", line)]


def _norm(cell: str) -> str:
  return re.sub(r"[`*]", "", cell).replace("−", "-").strip()


def markdown_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
  """Every pipe table in `text`: (header, rows), cells stripped."""
  tables, lines, i = [], text.splitlines(), 0
  while i + 1 < len(lines):
    if (lines[i].lstrip().startswith("|") and
        re.fullmatch(r"\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*", lines[i + 1])):
      header, rows, i = _cells(lines[i]), [], i + 2
      while i < len(lines) and lines[i].lstrip().startswith("|"):
        rows.append(_cells(lines[i]))
        i += 1
      tables.append((header, rows))
    else:
      i += 1
  return tables


@functools.cache
def load_tables(path: pathlib.Path) -> tuple:
  """The tables of a .md file, or the one table of a .csv."""
  if path.suffix == ".csv":
    with path.open(newline="") as f:
      rows = list(csv.reader(f))
    return ((rows[0], rows[1:]),) if rows else ()
  return tuple(markdown_tables(path.read_text()))


def cell_text(marker: Marker, results: pathlib.Path = RESULTS) -> str:
  """The cell a marker names (a composite `est/lo/hi` column as "est [lo, hi]");
  ValueError (one line) when the file, column or row is missing or the row is not
  unique."""
  path = results / marker.file
  if not path.is_file():
    raise ValueError(f"no table file {marker.file} under docs/results")
  want = [_norm(t) for t in marker.row]
  cols = [_norm(marker.col)]
  if "/" in marker.col and len(marker.col.split("/")) == 3:
    cols = [_norm(c) for c in marker.col.split("/")]
  found = []
  for header, rows in load_tables(path):
    heads = [_norm(h) for h in header]
    if not all(c in heads for c in cols):
      if len(cols) == 3 and _norm(marker.col) in heads:
        cols = [_norm(marker.col)]
      else:
        continue
    js = [heads.index(c) for c in cols]
    for r in rows:
      normed = [_norm(c) for c in r]
      if all(w in normed for w in want):
        got = [r[j] if j < len(r) else "" for j in js]
        found.append(got[0] if len(got) == 1 else f"{got[0]} [{got[1]}, {got[2]}]")
    if found:
      break
  else:
    raise ValueError(f"{marker.file}: no table has the column {marker.col!r}")
  if len(found) != 1:
    raise ValueError(f"{marker.file}: row {' & '.join(marker.row)!r} matches {len(found)} rows "
                     f"(add a term that makes it one)")
  return found[0]


def cell_numbers(text: str, nth: int = 1) -> tuple[str, ...]:
  """The `nth` estimate-with-interval of a cell (est, lo, hi), else its first number."""
  found = list(INTERVAL_RE.finditer(text))
  if found:
    if nth > len(found):
      raise ValueError(f"cell {text!r} has {len(found)} intervals, marker asks for n={nth}")
    m = found[nth - 1]
    return m["est"], m["lo"], m["hi"]
  m = re.search(r"[+\-−]?\d[\d,]*(?:\.\d+)?(?:e[+\-−]?\d+)?", text)
  if not m:
    raise ValueError(f"cell {text!r} holds no number")
  return (m.group(0),)


def verdict_of(lo: float, hi: float) -> str:
  """The verdict `stats.Comparison` gives an interval of b - a (lower is better)."""
  from attnscale.experiments import stats
  return stats.verdict_of(lo, hi)


def stated_verdict(after: str) -> str | None:
  """The verdict word a sentence gives right after a tied number: the clause up to
  the next punctuation, table bar or number (25 characters at most), when it holds
  exactly one of VERDICTS: "...]: worse", "...] better"."""
  clause = re.split(r"[;.,()\[\]|\n]|\d", after, maxsplit=1)[0][:25].lower()
  words = [w for w in VERDICTS if re.search(rf"\b{w}\b", clause)]
  return words[0] if len(words) == 1 else None


def compare_quote(quote: Quote, marker: Marker, results: pathlib.Path = RESULTS,
                  after: str = "") -> str | None:
  """None when the quote equals its cell, else one line saying how it differs; `after`
  (the text after the marker) names a length ("... at 1,024") that an `L=N` column
  must match."""
  try:
    cell = cell_text(marker, results)
    numbers = cell_numbers(cell, marker.nth)
  except ValueError as e:
    return str(e)
  page = quote.values()
  if len(numbers) < len(page):
    return f"{quote.text!r} has an interval; the cell {cell!r} has none"
  numbers = numbers[:len(page)]
  values = [_float(n) for n in numbers]
  if marker.neg:
    values = [-values[0]] + ([-values[2], -values[1]] if len(values) == 3 else [])
  for printed, value in zip(page, values):
    if not math.isfinite(value) or abs(_float(printed) - value) > _half_ulp(printed) * (1 + 1e-9):
      return (f"{quote.text!r} is not its cell: {marker.file} row {' & '.join(marker.row)!r} "
              f"col {marker.col!r} holds {cell!r}{' (negated)' if marker.neg else ''}")
  said_at = re.match(r"\s*(?:nats\s+|points\s+)?(?:worse\s+|better\s+)?at\s+(\d[\d,]*)\b", after)
  col_at = re.fullmatch(r"L=(\d+)", marker.col.strip())
  if said_at and col_at and int(said_at.group(1).replace(",", "")) != int(col_at.group(1)):
    return (f"{quote.text!r} is said to be at {said_at.group(1)}; its cell is column "
            f"{marker.col!r}")
  if marker.verdict is not None:
    if len(values) < 3:
      return f"{quote.text!r}: verdict={marker.verdict} needs an interval"
    # The cell's own word where it prints one (the study read it at full precision:
    # "+0.003 [+0.000, +0.006] ...: worse" has a lower end above 0), else the rule on
    # the printed ends.
    own = re.search(r":\s*(better|worse|within noise)\b", cell)
    if own and not marker.neg:
      rule = own.group(1)
    else:
      lo, hi = values[1], values[2]
      rule = verdict_of(*((-hi, -lo) if marker.neg else (lo, hi)))
      if marker.higher:
        rule = {"worse": "better", "better": "worse"}.get(rule, rule)
    if rule != marker.verdict:
      return (f"{quote.text!r} is said to be {marker.verdict!r}; its interval reads "
              f"{rule!r} (stats.Comparison.verdict)")
  return None


# ---------------------------------------------------------------------------
# A page.

def _blank(match: re.Match) -> str:
  """Keep offsets and line numbers: a span's characters become spaces, its newlines stay."""
  return re.sub(r"[^\n]", " ", match.group(0))


def quotes_and_markers(text: str) -> list[tuple[Quote, Marker | None, str | None, str]]:
  """Each estimate-with-interval (and each bare number a marker follows) outside code
  blocks, with the marker right after it (None when untied), a marker parse error
  and the text after it (for the verdict word)."""
  text = GENERATED_RE.sub(_blank, SUPERSEDED_RE.sub(_blank, FENCE_RE.sub(_blank, text)))
  out, taken = [], set()
  for m in MARKER_RE.finditer(text):
    before = text[:m.start()]
    line = before.count("\n") + 1
    stripped = before.rstrip()
    gap = len(before) - len(stripped)
    hit = None
    for q in INTERVAL_RE.finditer(stripped[-200:]):
      if q.end() == len(stripped[-200:]):
        hit = q
    try:
      marker, error = parse_marker(m["body"]), None
    except ValueError as e:
      marker, error = None, str(e)
    if hit is not None:
      start = m.start() - gap - (len(stripped[-200:]) - hit.start())
      quote = Quote(hit["est"], hit["lo"], hit["hi"], line, hit.group(0), start + len(hit.group(0)))
    else:
      bare = BARE_RE.search(stripped)
      if bare is None:
        out.append((Quote("", None, None, line, m.group(0)), None,
                    error or "marker follows no number", ""))
        continue
      start = bare.start()
      quote = Quote(bare["est"], None, None, line, bare.group(0).strip(), len(stripped))
    taken.add(start)
    out.append((quote, marker, error, text[m.end():m.end() + 80]))
  plain = COMMENT_RE.sub(lambda c: " " * len(c.group(0)), text)
  for q in INTERVAL_RE.finditer(plain):
    if q.start() not in taken:
      line = plain[:q.start()].count("\n") + 1
      after = "untied" if UNTIED_RE.match(text, q.end()) else ""
      out.append((Quote(q["est"], q["lo"], q["hi"], line, q.group(0), q.end()), None, None,
                  after))
  spans = [(q.start(), q.end()) for q in INTERVAL_RE.finditer(plain)]
  for b in BARE_INTERVAL_RE.finditer(plain):
    if not any(a <= b.start() < e for a, e in spans) and not UNTIED_RE.match(text, b.end()):
      line = plain[:b.start()].count("\n") + 1
      out.append((Quote("", None, None, line, b.group(0), b.end()), None,
                  f"{b.group(0)!r}: an interval without its estimate beside it (write "
                  "'x [lo, hi]' and tie it)", ""))
  return sorted(out, key=lambda t: t[0].line)


def check_page(path: pathlib.Path, results: pathlib.Path = RESULTS,
               text: str | None = None) -> list[str]:
  """Every problem on one page, one line each ("page:line: ..."); [] when it holds."""
  text = path.read_text() if text is None else text
  problems = []
  name = path.name if path.parent == ROOT else str(path.relative_to(ROOT)) \
      if path.is_relative_to(ROOT) else str(path)
  for quote, marker, error, after in quotes_and_markers(text):
    if marker is not None and marker.verdict is None and quote.lo is not None:
      said = stated_verdict(after)
      if said:
        marker = dataclasses.replace(marker, verdict=said)
    if error:
      problems.append(f"{name}:{quote.line}: {error}")
    elif marker is None and after == "untied":
      continue
    elif marker is None:
      problems.append(f"{name}:{quote.line}: {quote.text!r} is not tied to a cell "
                      f"(add <!-- cell: FILE, row=..., col=... --> after it)")
    else:
      diff = compare_quote(quote, marker, results, COMMENT_RE.sub("", after))
      if diff:
        problems.append(f"{name}:{quote.line}: {diff}")
  return problems


def untied(path: pathlib.Path) -> list[str]:
  """The page's intervals marked `<!-- untied: ... -->` ("page:line: x [lo, hi]")."""
  return [f"{path.name}:{q.line}: {q.text}" for q, m, _, after in
          quotes_and_markers(path.read_text()) if m is None and after == "untied"]


def pages(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
  """The pages the check covers: every study page and the README."""
  return sorted((root / "docs" / "experiments").glob("*.md")) + [root / "README.md"]


def _index(results: pathlib.Path) -> list[tuple]:
  """Every estimate-with-interval in the tables under `results`: (file, header, row,
  column name, n, (est, lo, hi), row key), a .csv only where no .md of its name."""
  out = []
  files = sorted(results.rglob("*.md")) + [
      c for c in sorted(results.rglob("*.csv")) if not c.with_suffix(".md").exists()]
  for table in files:
    for header, rows in load_tables(table):
      heads = [_norm(h) for h in header]
      for i, r in enumerate(rows):
        for j, cell in enumerate(r):
          entries = [(k, (m["est"], m["lo"], m["hi"]), heads[j] if j < len(heads) else "")
                     for k, m in enumerate(INTERVAL_RE.finditer(cell), 1)]
          if (not entries and j + 2 < len(r) and j + 2 < len(heads) and
              heads[j + 1].endswith("lo") and heads[j + 2].endswith("hi")):
            try:
              [_float(r[j + t]) for t in range(3)]
              entries = [(1, (r[j], r[j + 1], r[j + 2]), "/".join(heads[j:j + 3]))]
            except ValueError:
              pass
          for k, numbers, col in entries:
            out.append((table.relative_to(results), header, r, col, k, numbers,
                        _row_key(rows, i)))
  return out


def _row_key(rows: list[list[str]], i: int) -> tuple[str, ...]:
  """Few of row i's cells (its first, then greedily the leftmost of those that rule
  out the most other rows: the identifying columns) that no other row holds all of."""
  row = rows[i]
  normed = [[_norm(x) for x in r] for r in rows]
  key = [row[0]]
  pool = [(j, c) for j, c in enumerate(row) if j and c and c != "nan" and len(c) <= 40
          and not INTERVAL_RE.search(c) and "&" not in c and "-->" not in c]

  def others(terms):
    return sum(1 for k, r in enumerate(normed) if k != i and all(_norm(t) in r for t in terms))

  while others(key) and pool:
    best = min(pool, key=lambda jc: (others(key + [jc[1]]), jc[0]))
    if others(key + [best[1]]) == others(key):
      break
    key.append(best[1])
    pool.remove(best)
  return tuple(key)


def _matches(quote: Quote, numbers: tuple[str, ...], neg: bool) -> bool:
  values = [_float(n) for n in numbers]
  if neg:
    values = [-values[0], -values[2], -values[1]]
  return all(abs(_float(p) - v) <= _half_ulp(p) * (1 + 1e-9)
             for p, v in zip(quote.values(), values))


def candidates(path: pathlib.Path, text: str, results: pathlib.Path = RESULTS) -> list:
  """For each untied interval on a page, (quote, [marker body, ...]) best first: the
  cells holding it at printed precision, those whose row names a word of the text
  before it first, then those in the page's own results folders."""
  index = _index(results)
  own = set(re.findall(r"results/([\w]+)/", text))
  plain = FENCE_RE.sub(_blank, text)
  out = []
  for quote, marker, _, _ in quotes_and_markers(text):
    if marker is not None or quote.lo is None:
      continue
    before = plain[max(0, quote.end - len(quote.text) - 160):quote.end - len(quote.text)]
    before = before.lower().replace("`", "").replace("\n", " ")
    scored = []
    for file, _, r, col, k, numbers, key in index:
      for neg in (False, True):
        if _matches(quote, numbers, neg):
          words = sum(1 for c in r if len(c) > 2 and _norm(c).lower() in before)
          body = (f"{file}, row={' & '.join(key)}, col={col}" + (", neg" if neg else "")
                  + (f", n={k}" if k > 1 else ""))
          scored.append((-words, neg, file.parts[0] not in own, str(file), body))
    scored.sort()
    out.append((quote, [b for *_, b in scored]))
  return out


def suggest(path: pathlib.Path, results: pathlib.Path = RESULTS) -> list[str]:
  """For each untied interval on a page, the cells that hold it (printed precision)."""
  return [f"{path.name}:{q.line}: {q.text}  ->  " + (" || ".join(c[:4]) if c else "NO CELL")
          for q, c in candidates(path, path.read_text(), results)]


def tie(path: pathlib.Path, results: pathlib.Path = RESULTS) -> int:
  """Write the best candidate's marker after each untied interval that has one; the
  number tied. Read the result: a coincidence of digits can pick the wrong row."""
  text = path.read_text()
  done = 0
  for quote, found in sorted(candidates(path, text, results), key=lambda c: -c[0].end):
    if found:
      text = text[:quote.end] + f"<!-- cell: {found[0]} -->" + text[quote.end:]
      done += 1
  path.write_text(text)
  return done


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("pages", nargs="*", help="pages to check (default: every study page "
                      "and the README)")
  parser.add_argument("--suggest", action="store_true",
                      help="print candidate cells for each untied interval instead")
  parser.add_argument("--tie", action="store_true",
                      help="write the best candidate's marker after each untied interval")
  args = parser.parse_args(argv)
  paths = [pathlib.Path(p).resolve() for p in args.pages] or pages()
  if args.tie:
    for p in paths:
      print(f"{p.name}: tied {tie(p)}")
    return 0
  if args.suggest:
    for p in paths:
      print("\n".join(suggest(p)))
    return 0
  problems = [line for p in paths for line in check_page(p)]
  print("\n".join(problems) if problems else f"{len(paths)} pages: every quoted interval "
        "equals its cell")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
