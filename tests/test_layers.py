"""The library's imports run one way (DESIGN.md, Layout): `coreai` -> {`guided`, `recipes`, `runtime`},
`guided` -> `runtime`, `recipes` -> `runtime`; `runtime` imports none of `guided`, `coreai`, `recipes`;
`guided` none of `coreai`, `recipes`; `recipes` none of `guided`, `coreai`; and no library package
(`coreai`, `guided`, `runtime`, `recipes`) imports `benchmarks`, `conformance` or `tests` (the
benchmarks reach the command line through the `coreai.commands` entry point). No library module
imports another in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("coreai", "guided", "runtime", "recipes")
# What each library package must not import (coreai, the public face, may import every other one).
FORBIDDEN = {
    "runtime": ("guided", "coreai", "recipes"),
    "guided": ("coreai", "recipes"),
    "recipes": ("guided", "coreai"),
    "coreai": (),
}
NEVER_FROM_THE_LIBRARY = ("benchmarks", "conformance", "tests")
# Import cycles that exist today, each a set of modules, to be removed (issue #35): runtime.speculative
# imports runtime.value_lookup inside `make_drafter`, and value_lookup subclasses speculative's PromptLookup.
KNOWN_CYCLES: list[set[str]] = []  # none since runtime.drafters took make_drafter (#35)


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


def library_files() -> list[Path]:
    files = [path for package in LIBRARY for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 20  # the scan found the packages
    return files


def test_each_package_imports_only_the_layers_below_it():
    offenders = []
    for path in library_files():
        package = path.relative_to(ROOT).parts[0]
        forbidden = FORBIDDEN[package] + NEVER_FROM_THE_LIBRARY
        for name in imported_modules(ast.parse(path.read_text(), filename=str(path))):
            if name.split(".")[0] in forbidden:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    return getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"


def import_graph(sources: dict[str, tuple[str, bool]], type_level: bool = True) -> dict[str, set[str]]:
    """module -> the library modules it imports, from `sources` (module -> (source text, is a package's
    __init__)). Relative imports are resolved; `from p import x` is an edge to the module `p.x` when
    there is one, else to `p`. Function-level imports count (a deferred import hides a cycle, it does
    not remove it: each module still needs the other), and so do imports under `if TYPE_CHECKING:`
    unless `type_level` is False (they never run, but a type-level circle is still two modules that
    know each other). The parent packages an import runs first (`runtime/__init__.py` before
    `runtime.errors`) are not edges: a package's __init__ re-exports its modules by design."""

    def known(name: str) -> str | None:
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, (text, is_package) in sources.items():
        edges = graph.setdefault(module, set())
        here = module.split(".") if is_package else module.split(".")[:-1]

        # The loop's values bound now: `visit` runs within this iteration only.
        def visit(node: ast.AST, here=here, module=module, edges=edges) -> None:
            if isinstance(node, ast.If) and _type_checking_only(node) and not type_level:
                for child in node.orelse:
                    visit(child)
                return
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in filter(None, map(known, targets)):
                if target != module:
                    edges.add(target)
            for child in ast.iter_child_nodes(node):
                visit(child)

        visit(ast.parse(text))
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(component)
    return cycles


def test_the_cycle_finder_sees_deferred_and_relative_imports():
    sources = {
        "p": ("from p.a import f\n", True),
        "p.a": ("from . import b\n", False),
        "p.b": ("def g():\n    from p.a import f\n", False),
        "p.c": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.d import x\n", False),
        "p.d": ("import p.c\nfrom p import a\n", False),
    }
    graph = import_graph(sources, type_level=False)
    assert graph == {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": set(), "p.d": {"p.c", "p.a"}}
    assert import_cycles(graph) == [{"p.a", "p.b"}]
    typed = import_graph(sources)  # type-level edges count by default
    assert typed["p.c"] == {"p.d"} and {"p.c", "p.d"} in import_cycles(typed)


def test_no_library_module_imports_another_in_a_circle():
    """Module-level, function-level and `if TYPE_CHECKING:` imports all count (see `import_graph`).
    The known cycles (KNOWN_CYCLES) pass only as they are."""
    sources = {module_name(path): (path.read_text(), path.name == "__init__.py") for path in library_files()}
    cycles = [cycle for cycle in import_cycles(import_graph(sources)) if cycle not in KNOWN_CYCLES]
    assert not cycles, [sorted(cycle) for cycle in cycles]


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


SERVER = ROOT / "coreai" / "server"
DIALECTS = ("coreai.server.openai", "coreai.server.responses", "coreai.server.anthropic")
# The one declared module through which a dialect may use another's types (the OpenAI family's).
SHARED = {"coreai.server.responses": ("coreai.server.openai.family",)}


def absolute_imports(path: Path) -> set[str]:
    """The modules `path` imports, `from p import m` also as `p.m` (a submodule named as a name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set(imported_modules(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_the_dialects_are_packages():
    assert all((ROOT / d.replace(".", "/") / "__init__.py").exists() for d in DIALECTS)
    assert not [p.name for p in SERVER.glob("*.py") if p.stem.startswith(("messages", "responses"))]


def test_no_dialect_imports_another():
    """Each API dialect imports the shell and the service, never another dialect; Responses shares
    the OpenAI family's types through `coreai.server.openai.family` only."""
    offenders = []
    for dialect in DIALECTS:
        for path in sorted((ROOT / dialect.replace(".", "/")).rglob("*.py")):
            for name in absolute_imports(path):
                for other in DIALECTS:
                    inside = name == other or name.startswith(other + ".")
                    allowed = any(name == s or name.startswith(s + ".") for s in SHARED.get(dialect, ()))
                    if other != dialect and inside and not allowed:
                        offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders


def test_the_service_imports_no_dialect_and_no_http():
    forbidden = ("coreai.server", "coreai.commands", "fastapi", "starlette", "uvicorn", "httpx")
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "coreai" / "service").rglob("*.py"))
        for name in imported_modules(ast.parse(path.read_text()))
        if name.startswith(forbidden)
    ]
    assert not offenders, offenders


def test_coreai_reaches_guided_only_through_its_package_faces():
    """`coreai` imports `guided` and `guided.tools` (the packages' `__init__` faces), never a module
    inside them, so guided may move its modules without breaking its users."""
    faces = {"guided", "guided.tools"}
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "coreai").rglob("*.py"))
        for name in imported_modules(ast.parse(path.read_text()))
        if (name == "guided" or name.startswith("guided.")) and name not in faces
    ]
    assert not offenders, offenders


# Words of one dialect's wire format or client: the shell's code (not its docstrings) names none of them.
DIALECT_VOCABULARY = (
    "anthropic",
    "claude",
    "codex",
    "/v1/messages",
    "/v1/chat",
    "/v1/completions",
    "/v1/responses",
    "/api/hello",
    "tool_use",
    "tool_result",
    "chat.completion",
    "response.created",
    "input_schema",
    "max_output_tokens",
)


def code_words(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string literal but docstrings, and every name, attribute, function,
    class and argument name in `tree`."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    words: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            words.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            words.append((node.lineno, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.append((node.lineno, node.name))
        elif isinstance(node, ast.arg):
            words.append((node.lineno, node.arg))
    return words


def test_the_shell_names_no_dialect():
    """`coreai/server/*.py` (the shell: app, dispatch, errors, models, OpenAPI, trust, ...) knows the
    dialects only as their packages' `Dialect`s: only `app.py` imports a dialect package, and uses
    nothing of it but `DIALECT`; no code in the shell names a dialect's wire format or client
    (`DIALECT_VOCABULARY`), so a dialect's routes, error shape, model card, union tags and probes
    live in its package."""
    offenders = []
    packages = {d.rsplit(".", 1)[1] for d in DIALECTS}
    for path in sorted(SERVER.glob("*.py")):
        tree = ast.parse(path.read_text())
        for name in absolute_imports(path):
            if any(name == d or name.startswith(d + ".") for d in DIALECTS):
                if not (path.name == "app.py" and name in DIALECTS):
                    offenders.append(f"{path.name} imports {name}")
        for line, word in code_words(tree):
            registry = path.name == "app.py" and word in packages  # the packages' names, checked below
            if not registry and any(term in word.lower() for term in DIALECT_VOCABULARY):
                offenders.append(f"{path.name}:{line} names {word!r}")
    app = ast.parse((SERVER / "app.py").read_text())
    for node in ast.walk(app):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in packages:
            if node.attr != "DIALECT":
                offenders.append(f"app.py:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not offenders, offenders


def test_the_shell_rule_catches_a_dialects_word():
    """The rule above fails on what it exists to catch: a literal path, a header and a client's name."""
    tree = ast.parse(
        '"""Mentions anthropic in a docstring, which is allowed."""\nh = "anthropic-version"\nclaude = 1\n'
    )
    named = [w for _, w in code_words(tree) if any(t in w.lower() for t in DIALECT_VOCABULARY)]
    assert named == ["anthropic-version", "claude"]
