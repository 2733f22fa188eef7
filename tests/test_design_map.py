"""DESIGN.md's map tells the truth (issue #58): every module of the library packages (`coreai/`, `guided/`,
`runtime/`, `recipes/`; a `.py` file other than `__init__.py`) is named on it once, and every module or
folder it names exists; a backticked `*.py` anywhere else in DESIGN.md names a file that exists.

The map's rule (DESIGN.md, "The map", says the same): the map is the fenced blocks under the heading
`## The map`. Every line of them is `<indent><names>  <job>`: the names, then two or more spaces, then
the one-line job. The names are a folder (`coreai/service/`, ending with `/`) or modules separated by
commas (`engine.py, worker.py`). A name is relative to the nearest folder line above it that is indented
less; a name at column 0 is a path from the repository's root (`coreai/session.py`).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "DESIGN.md"
LIBRARY = ("coreai", "guided", "runtime", "recipes")
HEADING = "## The map"
ENTRY = re.compile(r"( *)(\S.*?)(?: {2,}(\S.*))?$")
FOLDER = re.compile(r"[\w.-]+(?:/[\w.-]+)*/")
MODULE = re.compile(r"(?:[\w.-]+/)*\w+\.py")
BACKTICKED_PY = re.compile(r"`([\w./-]*\w\.py)`")


def library_modules() -> set[str]:
    """Every module of the library packages, as a path from the root (`coreai/server/app.py`)."""
    found = {
        path.relative_to(ROOT).as_posix()
        for package in LIBRARY
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    }
    assert len(found) > 100  # the scan found the packages
    return found


def map_blocks(text: str) -> list[list[str]]:
    """The lines of each fenced block under the heading `## The map` (up to the next `## ` heading)."""
    start = text.index(f"\n{HEADING}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return [block.splitlines() for block in re.findall(r"^```[^\n]*\n(.*?)^```", section, flags=re.S | re.M)]


def read_map(blocks: list[list[str]]) -> tuple[list[str], list[str], list[str]]:
    """(modules, folders, problems): the paths from the root of the modules and folders the map names,
    in order (a module named twice is listed twice), and each line that breaks the rule."""
    modules: list[str] = []
    folders: list[str] = []
    problems: list[str] = []
    for lines in blocks:
        stack: list[tuple[int, str]] = []  # (indent, folder path from the root) of the folder lines above
        for line in lines:
            if not line.strip():
                continue
            indent, names, job = ENTRY.match(line.rstrip()).groups()  # type: ignore[union-attr]
            while stack and stack[-1][0] >= len(indent):
                stack.pop()
            if indent and not stack:
                problems.append(f"indented under no folder: {line!r}")
                continue
            parent = stack[-1][1] if stack else ""
            parts = names.split(", ")
            if not FOLDER.fullmatch(names) and not all(MODULE.fullmatch(part) for part in parts):
                problems.append(f"neither a folder nor modules separated by ', ': {line!r}")
                continue
            if not job:
                problems.append(f"no job after two spaces: {line!r}")
            if FOLDER.fullmatch(names):
                folders.append(parent + names)
                stack.append((len(indent), parent + names))
            else:
                modules += [parent + part for part in parts]
    return modules, folders, problems


def design_map() -> tuple[list[str], list[str]]:
    blocks = map_blocks(DESIGN.read_text())
    assert blocks, f"DESIGN.md has no fenced block under {HEADING!r}"
    modules, folders, problems = read_map(blocks)
    assert not problems, problems
    return modules, folders


def test_the_rule_reads_folders_nesting_and_lists():
    blocks = [
        [
            "coreai/session.py    the session",
            "coreai/service/      the service",
            "  engine.py, worker.py   the engine and its thread",
            "coreai/server/       the shell",
            "  openai/            a dialect",
            "    routes.py        its routes",
            "  app.py             the app",
            "    a continuation of a job",
        ]
    ]
    modules, folders, problems = read_map(blocks)
    assert modules == [
        "coreai/session.py",
        "coreai/service/engine.py",
        "coreai/service/worker.py",
        "coreai/server/openai/routes.py",
        "coreai/server/app.py",
    ]
    assert folders == ["coreai/service/", "coreai/server/", "coreai/server/openai/"]
    assert problems == ["neither a folder nor modules separated by ', ': '    a continuation of a job'"]
    assert read_map([["  app.py  the app"]])[2] == ["indented under no folder: '  app.py  the app'"]
    assert read_map([["app.py"]])[2] == ["no job after two spaces: 'app.py'"]


def test_every_module_is_on_the_map():
    modules, _ = design_map()
    missing = sorted(library_modules() - set(modules))
    assert not missing, f"add these modules to DESIGN.md's map, each with its one-line job: {missing}"


def test_the_map_names_only_what_exists():
    modules, folders = design_map()
    gone = [m for m in modules if not (ROOT / m).is_file()] + [f for f in folders if not (ROOT / f).is_dir()]
    assert not gone, f"DESIGN.md's map names what does not exist: {gone}"


def test_each_module_is_on_the_map_once():
    modules, _ = design_map()
    twice = sorted({m for m in modules if modules.count(m) > 1})
    assert not twice, twice


def test_design_names_only_files_that_exist():
    """A backticked `x.py` in DESIGN.md is a path from the root or the end of one (`server/dispatch.py`,
    `rope.py`): some file of the repository's Python packages ends with it."""
    files = {
        path.relative_to(ROOT).as_posix()
        for folder in (*LIBRARY, "benchmarks", "conformance", "tests")
        for path in (ROOT / folder).rglob("*.py")
    }
    named = set(BACKTICKED_PY.findall(DESIGN.read_text()))
    assert len(named) > 5
    unknown = sorted(n for n in named if n not in files and not any(f.endswith(f"/{n}") for f in files))
    assert not unknown, f"DESIGN.md names files that do not exist: {unknown}"
