"""Every relative link in README.md and docs/*.md resolves: the file it names exists, and its `#anchor` is a
heading of that page (GitHub's anchors). The README was split into topic pages under docs/ (docs35); a section
moved to another page left links to `#its-anchor` that GitHub renders as links to nowhere."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, every character but letters, digits, `_`, `-` and space
    dropped (backticks, slashes, brackets, colons), each space a `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(page: Path) -> list[str]:
    """The page's lines outside fenced code blocks, inline code spans removed."""
    lines, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(re.sub(r"`[^`]*`", "``", line))
    return lines


def anchors(page: Path) -> set[str]:
    """The page's heading anchors; a repeated heading's second anchor is `name-1`, as GitHub numbers them."""
    seen: dict[str, int] = {}
    for line in page.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading and not line.startswith("#!"):
            name = anchor(heading.group(1))
            seen[name] = seen.get(name, -1) + 1
    return {name if i == 0 else f"{name}-{i}" for name, n in seen.items() for i in range(n + 1)}


def broken_links(pages: list[Path], root: Path = REPO) -> list[str]:
    broken = []
    for page in pages:
        for line in prose(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
                    continue
                path, _, name = target.partition("#")
                linked = (page.parent / path).resolve() if path else page
                if not linked.exists():
                    broken.append(f"{page.relative_to(root)}: {target} (no such file)")
                elif name and linked.suffix == ".md" and name not in anchors(linked):
                    broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def test_github_anchors():
    """The anchors the README linked before the split, as GitHub made them from its headings."""
    assert anchor("Fleets and `kvsim plan`: how many GPUs for this traffic") == (
        "fleets-and-kvsim-plan-how-many-gpus-for-this-traffic")
    assert anchor("Disaggregated prefill/decode (xPyD)") == "disaggregated-prefilldecode-xpyd"
    assert anchor("Accuracy against real GPUs") == "accuracy-against-real-gpus"


def test_every_relative_link_and_anchor_in_readme_and_docs_resolves():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    assert len(pages) > 2  # the README, docs/architecture.md, docs/metrics.md at least
    assert broken_links(pages) == []


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n## Twice\n## Twice\n[x](b.md) [y](#twice-1) [z](#a-page)\n"
                                   "`[not a link](c.md)`\n```\n[code](d.md)\n```\n", encoding="utf-8")
    (tmp_path / "b.md").write_text("[back](a.md#twice) [gone](a.md#twice-2) [none](c.md)\n", encoding="utf-8")
    assert broken_links([tmp_path / "a.md", tmp_path / "b.md"], tmp_path) == [
        "b.md: a.md#twice-2 (no such heading)", "b.md: c.md (no such file)"]
