"""Every relative link in README.md and docs/*.md resolves: to a file or folder in the repo, and a `#anchor` into a
Markdown file to one of its headings (GitHub's slugs). Fast, no network: links with a scheme (https:, mailto:) are
not followed."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md",
        *sorted((REPO / "studies").glob("**/README.md"))]

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[ \t]*$", flags=re.M | re.S)
INLINE_CODE = re.compile(r"(`+).+?\1", flags=re.S)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REF_DEF = re.compile(r"^[ ]{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", flags=re.M)
HTML_ATTR = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", flags=re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")
HEADING = re.compile(r"^[ ]{0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", flags=re.M)


def _prose(text: str) -> str:
    """The Markdown without fenced blocks and code spans (a `[x](y)` in code is not a link)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (github-slugger): the rendered text lower-cased, every character that is not a
    letter, digit, mark, space, `-` or `_` removed, spaces turned into `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading renders as its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    keep = (c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return "".join(keep).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 … suffixes for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for _, title in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    prose = _prose(path.read_text(encoding="utf-8"))
    return INLINE_LINK.findall(prose) + REF_DEF.findall(prose) + HTML_ATTR.findall(prose)


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    """`file: target (why)` for each relative link of a Markdown file that does not resolve."""
    bad = []
    for target in links(path):
        if SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path.resolve()
        where = f"{path.relative_to(root)}: {target}"
        if not dest.is_relative_to(root.resolve()):
            bad.append(f"{where} (outside the repository)")
        elif not dest.exists():
            bad.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest):
            bad.append(f"{where} (no heading with this anchor)")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    assert doc.is_file(), doc
    assert broken_links(doc) == []


def test_the_link_check_finds_broken_links(tmp_path):
    """The check itself: a missing file, a missing anchor and a link out of the tree are found; a good link, an
    anchor with GitHub's slug, an external URL and a link inside code are not reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# Page\n\n## Eval, lineage & `DVC`\n\n## Repeat\n\n## Repeat\n\n### 你的租户 in five minutes\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "[ok](docs/page.md) [anchor](docs/page.md#eval-lineage--dvc) [second](docs/page.md#repeat-1)\n"
        "[cjk](docs/page.md#你的租户-in-five-minutes) [self](#top) [web](https://example.com/x.md)\n"
        "`[in code](docs/nope.md)`\n\n```\n[fenced](docs/nope.md)\n```\n\n# Top\n\n"
        "[missing](docs/nope.md) [bad anchor](docs/page.md#nope) ![image](docs/nope.svg) [out](../x.md)\n",
        encoding="utf-8")
    assert broken_links(tmp_path / "README.md", tmp_path) == [
        "README.md: docs/nope.md (no such file)",
        "README.md: docs/page.md#nope (no heading with this anchor)",
        "README.md: docs/nope.svg (no such file)",
        "README.md: ../x.md (outside the repository)",
    ]


def test_the_readme_is_short_and_links_every_docs_page():
    """README.md is the ten-minute read (at most 250 lines); every page under docs/ is reachable from it."""
    readme = REPO / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 250
    linked = {(readme.parent / t.partition("#")[0]).resolve() for t in links(readme) if not SCHEME.match(t)}
    assert sorted(p.name for p in (REPO / "docs").glob("*.md") if p.resolve() not in linked) == []
