"""No library file is over 400 lines (issue #45): a file that grows past the cap is split by concern,
not trimmed to fit. The library is every .py file under `coreai`, `guided`, `runtime` and `recipes`."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("coreai", "guided", "runtime", "recipes")
MAX_LINES = 400


def line_counts() -> dict[str, int]:
    """Each library file (its path from the repository's root) and its number of lines."""
    files = [path for package in LIBRARY for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 20  # the scan found the packages
    return {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines()) for path in files}


def test_no_library_file_is_over_the_line_cap():
    over = {path: count for path, count in line_counts().items() if count > MAX_LINES}
    listed = "\n".join(f"  {path}: {count} lines" for path, count in sorted(over.items(), key=lambda item: -item[1]))
    assert not over, f"{len(over)} library file(s) over {MAX_LINES} lines (split each by concern):\n{listed}"
