"""The project's own docs hold together: every relative link in README.md and docs/ points to a file
in this repository (and to a heading that exists, when it names one), and nothing sends a reader
outside the checkout (tests/unit/test_reference_data.py checks that no file names a folder beside it).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def _prose(text: str) -> str:
    """The Markdown without fenced code blocks and inline code, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    """Every link target (inline, image or reference-style) in Markdown text, in order."""
    prose = _prose(text)
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", path.read_text()), re.MULTILINE)}


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    """Relative links of one Markdown file that point nowhere, or outside `root` (the repository)."""
    problems = []
    for target in links(path.read_text()):
        if EXTERNAL.match(target):
            continue
        file_part, _, fragment = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
        elif not destination.exists():
            problems.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            problems.append(f"{target}: no heading #{fragment} in {destination.name}")
    return problems


def test_link_checker_on_hand_made_markdown(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n## Step 1: the PR [SPC]\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](a.md) [anchor](a.md#step-1-the-pr-spc) ![img](a.md) [web](https://example.org/x)\n"
        "[gone](missing.md) [bad anchor](a.md#nope) [up](../../etc/passwd)\n"
        "`[code](missing-in-code.md)`\n```\n[fenced](missing-in-fence.md)\n```\n[ref]: missing-ref.md\n"
    )
    assert links(page.read_text()) == ["a.md", "a.md#step-1-the-pr-spc", "a.md", "https://example.org/x",
                                       "missing.md", "a.md#nope", "../../etc/passwd", "missing-ref.md"]
    assert slug("Step 1: the PR [SPC]") == "step-1-the-pr-spc"
    assert broken_links(page, root=tmp_path) == [
        "missing.md: no such file", "a.md#nope: no heading #nope in a.md",
        "../../etc/passwd: outside the repository", "missing-ref.md: no such file"]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve_inside_the_repo(path):
    assert broken_links(path) == []


def test_readme_links_the_methods_and_architecture_pages():
    targets = links((REPO / "README.md").read_text())
    assert "docs/methods.md" in targets and "docs/architecture.md" in targets
