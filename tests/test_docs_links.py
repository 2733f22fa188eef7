"""Every link to a page of the repository resolves: relative links in the Markdown files (with their
`#anchor`, as GitHub spells a heading's anchor) and every docs page named by path in a source, test,
Markdown or build file. Pages move (docs/reference/, docs/reports/, see docs/README.md); this finds
what still points at the old place."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]+\.md(?:#[\w-]+)?")
OTHER_PROJECTS = ("llguidance",)  # "llguidance docs/json_schema.md" is that project's page


def tracked(*suffixes: str) -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = [ROOT / name for name in names.split()]
    return [p for p in paths if p.is_file() and (p.suffix in suffixes or p.name in suffixes)]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    found, text = set(), re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = sum(1 for a in found if a == slug or re.fullmatch(re.escape(slug) + r"-\d+", a))
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken(target: str, base: Path) -> str | None:
    path, _, anchor = target.partition("#")
    page = (base / path).resolve() if path else None
    if page is not None and not page.exists():
        return "no such file"
    if anchor and page is not None and page.suffix == ".md" and anchor not in anchors(page):
        return f"no heading #{anchor}"
    return None


def test_markdown_links_resolve():
    problems = []
    for page in tracked(".md"):
        if "tests/data" in str(page) or "benchmarks/results" in str(page):
            continue
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            why = broken(target, page.parent)
            if why:
                problems.append(f"{page.relative_to(ROOT)}: {target}: {why}")
    assert not problems, problems


def test_named_docs_pages_exist():
    problems = []
    for path in tracked(".py", ".md", ".toml", "Makefile", "run"):
        if "tests/data" in str(path):
            continue
        text = path.read_text()
        for match in DOCS_PATH.finditer(text):
            if text[: match.start()].rstrip().endswith(OTHER_PROJECTS):
                continue
            target = match.group()
            why = broken(target, ROOT)
            if why:
                problems.append(f"{path.relative_to(ROOT)}: {target}: {why}")
    assert len(tracked(".md")) > 10
    assert not problems, problems
