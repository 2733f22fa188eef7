"""The Python floor holds (issue #58): pyproject.toml's `requires-python` is no lower than what the library's
code needs, and the suite runs on that floor in CI.

What the code needs is read from its syntax tree against a table of features that came with a version
(`FEATURES`: modules, names, syntax, and the builtin `TimeoutError` caught around asyncio's timeouts, which
raised `asyncio.TimeoutError`, another class, before 3.11). A feature not in the table is not seen: the table
holds the ones this code base uses or is likely to, and grows with them. The reasons pyproject.toml gives for
the floor are checked to be in the code still, so its comment stays true.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("coreai", "guided", "runtime", "recipes")

# Modules (imported whole or from) that first came in a version.
MODULES = {
    "tomllib": (3, 11),
    "re._constants": (3, 11),
    "re._parser": (3, 11),
    "re._compiler": (3, 11),
    "re._casefix": (3, 11),
    "wsgiref.types": (3, 11),
}
# Names of a module that first came in a version, imported from it or read as `module.name`.
NAMES = {
    ("typing", "Self"): (3, 11),
    ("typing", "LiteralString"): (3, 11),
    ("typing", "Never"): (3, 11),
    ("typing", "assert_never"): (3, 11),
    ("typing", "reveal_type"): (3, 11),
    ("typing", "Required"): (3, 11),
    ("typing", "NotRequired"): (3, 11),
    ("typing", "TypeVarTuple"): (3, 11),
    ("typing", "Unpack"): (3, 11),
    ("typing", "dataclass_transform"): (3, 11),
    ("enum", "StrEnum"): (3, 11),
    ("datetime", "UTC"): (3, 11),
    ("asyncio", "TaskGroup"): (3, 11),
    ("asyncio", "timeout"): (3, 11),
    ("asyncio", "timeout_at"): (3, 11),
    ("asyncio", "Runner"): (3, 11),
    ("hashlib", "file_digest"): (3, 11),
    ("operator", "call"): (3, 11),
    ("contextlib", "chdir"): (3, 11),
    ("typing", "override"): (3, 12),
    ("typing", "TypeAliasType"): (3, 12),
    ("itertools", "batched"): (3, 12),
    ("warnings", "deprecated"): (3, 13),
    ("copy", "replace"): (3, 13),
}
BUILTINS = {"ExceptionGroup": (3, 11), "BaseExceptionGroup": (3, 11)}
ASYNCIO_TIMEOUTS = ("wait_for", "timeout", "timeout_at")


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)):
        return f"{base}.{node.attr}"
    return None


def _awaits_an_asyncio_timeout(body: list[ast.stmt]) -> bool:
    for node in (n for stmt in body for n in ast.walk(stmt)):
        target = node.func if isinstance(node, ast.Call) else None
        name = _dotted(target) if target is not None else None
        if name and name.rpartition(".")[0] == "asyncio" and name.rpartition(".")[2] in ASYNCIO_TIMEOUTS:
            return True
    return False


def _catches_builtin_timeout(handler: ast.ExceptHandler) -> bool:
    caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(c, ast.Name) and c.id == "TimeoutError" for c in caught)


def needs(source: str) -> list[tuple[tuple[int, int], int, str]]:
    """(version, line, what) for each feature of `FEATURES` that `source` uses."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [(MODULES[a.name], line, f"import {a.name}") for a in node.names if a.name in MODULES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in MODULES:
                found.append((MODULES[node.module], line, f"from {node.module} import ..."))
            for alias in node.names:
                if f"{node.module}.{alias.name}" in MODULES:
                    found.append((MODULES[f"{node.module}.{alias.name}"], line, f"import {node.module}.{alias.name}"))
                if (node.module, alias.name) in NAMES:
                    found.append((NAMES[node.module, alias.name], line, f"from {node.module} import {alias.name}"))
        elif isinstance(node, ast.Attribute) and (name := _dotted(node)):
            module, _, attr = name.rpartition(".")
            if (module, attr) in NAMES:
                found.append((NAMES[module, attr], line, name))
        elif isinstance(node, ast.Name) and node.id in BUILTINS:
            found.append((BUILTINS[node.id], line, node.id))
        elif type(node).__name__ == "TryStar":
            found.append(((3, 11), line, "except*"))
        elif type(node).__name__ == "TypeAlias":
            found.append(((3, 12), line, "a `type` statement"))
        elif getattr(node, "type_params", None):
            found.append(((3, 12), line, "type parameters (PEP 695)"))
        if isinstance(node, ast.Try) and _awaits_an_asyncio_timeout(node.body):
            for handler in node.handlers:
                if _catches_builtin_timeout(handler):
                    found.append(((3, 11), handler.lineno, "builtin TimeoutError caught around an asyncio timeout"))
    return found


def code_needs() -> list[tuple[tuple[int, int], str]]:
    """(version, "path:line: what") for every feature the library's modules use."""
    found = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            for version, line, what in needs(path.read_text()):
                found.append((version, f"{path.relative_to(ROOT).as_posix()}:{line}: {what}"))
    return found


def declared_floor() -> tuple[int, int]:
    """pyproject.toml's `requires-python`, which must be a plain `>=X.Y`."""
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.fullmatch(r"\s*>=\s*(\d+)\.(\d+)\s*", spec)
    assert match, f"requires-python {spec!r}: expected '>=X.Y'"
    return int(match[1]), int(match[2])


def test_the_scan_sees_each_kind_of_feature():
    source = """
import tomllib
import re._constants as sre_c
from re import _parser
from typing import Self
import asyncio, itertools
async def f(q):
    try:
        await asyncio.wait_for(q.get(), 1)
    except TimeoutError:
        pass
    try:
        await asyncio.wait_for(q.get(), 1)
    except asyncio.TimeoutError:
        pass
    try:
        q.get(timeout=1)
    except TimeoutError:
        pass
    return itertools.batched(q, 2)
"""
    assert sorted(needs(source)) == [
        ((3, 11), 2, "import tomllib"),
        ((3, 11), 3, "import re._constants"),
        ((3, 11), 4, "import re._parser"),
        ((3, 11), 5, "from typing import Self"),
        ((3, 11), 10, "builtin TimeoutError caught around an asyncio timeout"),
        ((3, 12), 20, "itertools.batched"),
    ]
    assert needs("try:\n    pass\nexcept* ValueError:\n    pass\n") == [((3, 11), 1, "except*")]


def test_the_floors_reasons_are_in_the_code():
    """The three reasons pyproject.toml's comment gives for 3.11 (when one goes, say so there)."""
    found = "\n".join(where for _, where in code_needs())
    assert re.search(r"guided/tools/escaped\.py:\d+: import re\._constants", found), found
    assert re.search(r"recipes/quantize\.py:\d+: import tomllib", found), found
    assert re.search(r"coreai/server/streaming\.py:\d+: builtin TimeoutError caught around", found), found
    pyproject = (ROOT / "pyproject.toml").read_text()
    for reason in ("re._constants", "tomllib", "TimeoutError"):
        assert reason in pyproject, f"pyproject.toml's comment on requires-python no longer names {reason}"


def test_the_declared_floor_is_what_the_code_needs():
    floor = declared_floor()
    found = code_needs()
    above = [f"{'.'.join(map(str, version))}: {where}" for version, where in found if version > floor]
    assert not above, f"requires-python >={'.'.join(map(str, floor))}, but the code needs more: {above}"


def test_this_python_is_on_or_above_the_floor():
    assert sys.version_info[:2] >= declared_floor()


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI only: a developer may run a newer Python")
def test_ci_runs_on_the_floor():
    """CI's Python is the declared floor, so the suite (and its `import coreai`) is a run on the floor."""
    floor = declared_floor()
    assert sys.version_info[:2] == floor, (
        f"CI runs Python {sys.version_info[0]}.{sys.version_info[1]}, the floor is {floor[0]}.{floor[1]}: "
        "run the suite on the floor too, or raise requires-python"
    )


def test_the_modules_that_need_the_floor_import():
    """`import coreai` and the modules behind the floor's reasons, in a fresh interpreter (this one)."""
    code = "import coreai, coreai.server.app, coreai.server.streaming, guided.tools.escaped, recipes.quantize"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
