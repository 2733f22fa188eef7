"""The library's imports run one way: nothing in `coreai`, `guided`, `runtime` or `recipes` imports
`benchmarks` (the benchmarks reach the command line through the `coreai.commands` entry point)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("coreai", "guided", "runtime", "recipes")


def imported_modules(tree: ast.AST) -> list[str]:
    """Every module named by an import statement of `tree` (also inside functions); relative imports
    are inside the package, so they are left out."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                names.append(node.args[0].value)
    return names


def test_the_scan_sees_every_form_of_import():
    source = "import benchmarks\nfrom benchmarks.server import main\n"
    source += "def f():\n    importlib.import_module('benchmarks.x')\n"
    assert imported_modules(ast.parse(source)) == ["benchmarks", "benchmarks.server", "benchmarks.x"]


def test_no_library_module_imports_the_benchmarks():
    offenders = []
    files = [path for package in LIBRARY for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 20  # the scan found the packages
    for path in files:
        for name in imported_modules(ast.parse(path.read_text(), filename=str(path))):
            if name == "benchmarks" or name.startswith("benchmarks."):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


def test_bench_reaches_the_cli_through_its_entry_point():
    """`coreai bench` is the benchmarks' command, found through the `coreai.commands` group of the
    installed metadata (after changing pyproject.toml's entry points, `pip install -e .` again)."""
    import tomllib

    from benchmarks import command
    from coreai.cli import build_parser

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["coreai.commands"] == {"bench": "benchmarks.command:register"}
    assert build_parser().parse_args(["bench", "-n", "1"]).func is command.run


def test_bench_without_the_benchmarks_says_how_to_get_them(monkeypatch, capsys):
    from coreai import cli

    monkeypatch.setattr(cli, "entry_points", lambda group: [])  # as in an install without them
    assert cli.main(["bench", "-n", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("coreai bench: error: ") and "pip install -e ." in err and "Traceback" not in err


def test_no_route_module_imports_another():
    """The server's route modules (those that make an `APIRouter`) share their helpers through
    `coreai.server.api`, below them, and never import each other."""
    server = ROOT / "coreai" / "server"
    routes = {f"coreai.server.{p.stem}": p for p in sorted(server.glob("*.py")) if "APIRouter(" in p.read_text()}
    assert {"coreai.server.routes", "coreai.server.responses"} <= routes.keys()
    offenders = []
    for name, path in routes.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        imported = set(imported_modules(tree))
        # `from coreai.server import routes` names the package; the module is an alias.
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "coreai.server":
                imported |= {f"coreai.server.{alias.name}" for alias in node.names}
        offenders += [f"{name} imports {other}" for other in routes if other != name and other in imported]
    assert not offenders, offenders
