"""The docs hold together: every relative link in README.md and docs/ resolves,
and the README stays a front page (at most 200 lines).

A link is a markdown link or image, `[text](target)` or `![alt](target)`, outside
code blocks and inline code. A relative target must name an existing file or
folder (resolved from the linking file's folder); a `#anchor` into a markdown
file must name one of its headings, slugged as GitHub does (lowercase, spaces to
'-', punctuation other than '-' and '_' dropped, repeats numbered -1, -2, ...).
"""

import functools
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 200

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
# [text](target) or ![alt](target "title"); text may hold one level of brackets.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _markdown_files() -> list[str]:
  files = [os.path.join(ROOT, "README.md")]
  for folder, _, names in os.walk(os.path.join(ROOT, "docs")):
    files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".md")]
  return files


def _prose_lines(path: str) -> list[tuple[int, str]]:
  """(line number, text) of the lines outside fenced code blocks, inline code removed."""
  out, in_fence = [], False
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if _FENCE.match(line):
        in_fence = not in_fence
        continue
      if not in_fence:
        out.append((number, _INLINE_CODE.sub("", line)))
  return out


def github_slug(heading: str) -> str:
  """GitHub's anchor for a heading's text (before de-duplication)."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
  text = text.replace("`", "").lower().strip()
  text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and '_' (any script)
  return text.replace(" ", "-")


@functools.cache
def anchors(path: str) -> frozenset[str]:
  seen: dict[str, int] = {}
  out = set()
  for _, line in _prose_lines(path):
    m = _HEADING.match(line)
    if not m:
      continue
    slug = github_slug(m.group(2))
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    out.add(slug if count == 0 else f"{slug}-{count}")
  return frozenset(out)


def relative_links(path: str) -> list[tuple[int, str]]:
  links = []
  for number, line in _prose_lines(path):
    for target in _LINK.findall(line):
      if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
        continue
      links.append((number, target))
  return links


def broken_links(path: str) -> list[str]:
  problems = []
  for number, target in relative_links(path):
    where = f"{os.path.relpath(path, ROOT)}:{number}: {target}"
    file_part, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
    if not resolved.startswith(ROOT + os.sep) and resolved != ROOT:
      problems.append(f"{where} (points outside the repository)")
    elif not os.path.exists(resolved):
      problems.append(f"{where} (no such file)")
    elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
      problems.append(f"{where} (no heading #{anchor} in {os.path.relpath(resolved, ROOT)})")
  return problems


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves(path):
  problems = broken_links(path)
  assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_at_most_200_lines():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    lines = f.read().splitlines()
  assert len(lines) <= README_MAX_LINES, (
      f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail into docs/")


def test_ci_sets_attnscale_data_as_the_readme_s_quick_start_does():
  """CI runs what users run: the README's export line, character for character."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    readme = [line.strip().removesuffix("&& \\").strip() for line in f
              if "export ATTNSCALE_DATA=" in line]
  with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
    ci = [line.strip() for line in f if line.startswith("export ATTNSCALE_DATA=")]
  assert len(readme) == 1 and ci == readme, (readme, ci)
  assert "$PWD" in readme[0], "the README's export must give an absolute path"


def test_docs_cite_no_files_outside_the_repository():
  """Docs name files inside the repository; the data folder is ATTNSCALE_DATA's business."""
  for path in _markdown_files():
    for number, target in relative_links(path):
      assert "shared/" not in target, f"{os.path.relpath(path, ROOT)}:{number}: {target}"


@pytest.mark.parametrize("heading, slug", [
    ("Stopping and resuming", "stopping-and-resuming"),
    ("The unit-scaled, residual-weighted transformer", "the-unit-scaled-residual-weighted-transformer"),
    ("Today's practice: soft-caps, sinks, gates", "todays-practice-soft-caps-sinks-gates"),
    ("Learning-rate x scaling sweeps", "learning-rate-x-scaling-sweeps"),
    ("`config.imports` and my_module", "configimports-and-my_module"),
])
def test_github_slugs(heading, slug):
  assert github_slug(heading) == slug


def test_a_broken_link_and_a_missing_anchor_are_reported(tmp_path, monkeypatch):
  monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
  page = tmp_path / "page.md"
  (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
  page.write_text("[ok](other.md#a-section) [gone](missing.md) [bad](other.md#nope)\n"
                  "```\n[in code](nowhere.md)\n```\n`[inline](nowhere.md)` [web](https://x.org)\n")
  problems = broken_links(str(page))
  assert len(problems) == 2 and "missing.md" in problems[0] and "#nope" in problems[1], problems


def _readme_section_commands(heading: str) -> list[str]:
  """The lines of the bash blocks in the README section under `## heading`."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    section = f.read().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
  blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
  return [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()
          if line.strip()]


def test_ci_runs_the_readme_s_test_command():
  """One command installs what the tests need and runs them; .ci/run runs exactly it."""
  (command,) = _readme_section_commands("Tests")
  assert command.startswith('pip install -e ".[test]" && ') and "pytest" in command, command
  with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
    ci = f.read()
  assert f'(source "$venv/bin/activate" && {command} "$@")' in ci, command


def _requirements(extra: str | None = None) -> list[str]:
  """The distributions requirements.txt installs (`-e .`: pyproject's dependencies),
  or an extra's, by name, lowercase."""
  import tomllib
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
  return [re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs]


def test_the_default_install_is_lean_and_opens_tensorboard():
  """requirements.txt: the library, its commands and TensorBoard; the tests' and the
  trackers' packages only in their extras (the README's test command adds them)."""
  with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
    lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
  assert lines == ["-e ."], lines
  default = _requirements()
  assert "tensorboard" in default, default  # the guide's `tensorboard --logdir runs`
  for name in ("pytest", "pytest-xdist", "ruff", "wandb", "trackio", "nbclient", "jupyterlab"):
    assert name not in default, name
  assert {"pytest", "wandb", "trackio"} <= set(_requirements("test"))
  assert set(_requirements("trackers")) == {"wandb", "trackio"}
  assert "jupyterlab" in _requirements("notebooks")
