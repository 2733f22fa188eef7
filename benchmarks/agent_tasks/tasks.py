"""The agent tasks: each a fresh workspace (`files`), a prompt, a checker deciding pass or fail from
the workspace and the CLI's final answer, and a hand-made solution (`solve`, for the checkers' own
tests: tests/test_bench_agent_tasks.py). The answers cannot be guessed: each needs the files read or
a command run, but `no_tool`."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Check = Callable[[Path, str], tuple[bool, str]]  # (workspace, final answer) -> (passed, why)


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str
    files: dict[str, str]
    check: Check
    solve: Callable[[Path], str]  # a hand-made solution: changes the workspace, returns the answer
    kind: str = "read"  # read | edit | run | none

    def write(self, workspace: Path) -> None:
        """The task's files in `workspace` (made)."""
        workspace.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            path = workspace / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def says(*needles: str, absent: tuple[str, ...] = ()) -> Check:
    """The answer holds every needle (case-insensitive) and none of `absent`."""

    def check(workspace: Path, answer: str) -> tuple[bool, str]:
        low = answer.lower()
        missing = [n for n in needles if n.lower() not in low]
        extra = [n for n in absent if n.lower() in low]
        if missing:
            return False, f"the answer lacks {missing}"
        if extra:
            return False, f"the answer names {extra}"
        return True, "the answer holds " + ", ".join(needles)

    return check


def file_is(name: str, expected: str) -> Check:
    """`name` holds exactly `expected` (trailing whitespace aside)."""

    def check(workspace: Path, answer: str) -> tuple[bool, str]:
        path = workspace / name
        if not path.is_file():
            return False, f"{name} is missing"
        if path.read_text().rstrip() != expected.rstrip():
            return False, f"{name} is not as asked: {path.read_text()[:200]!r}"
        return True, f"{name} is as asked"

    return check


def runs(command: list[str], unchanged: dict[str, str], *, out: str | None = None) -> Check:
    """`command` exits 0 in the workspace (its output holding `out`, when given), and the files in
    `unchanged` (a test) are as they were written."""

    def check(workspace: Path, answer: str) -> tuple[bool, str]:
        for name, text in unchanged.items():
            if not (workspace / name).is_file() or (workspace / name).read_text() != text:
                return False, f"{name} was changed"
        try:
            done = subprocess.run(command, cwd=workspace, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return False, f"{' '.join(command)} ran over 60 s"
        if done.returncode != 0:
            return False, f"{' '.join(command)} exits {done.returncode}: {(done.stderr or done.stdout)[-300:]!r}"
        if out is not None and out not in done.stdout:
            return False, f"{' '.join(command)} prints {done.stdout[-200:]!r}, not {out!r}"
        return True, f"{' '.join(command)} passes"

    return check


def both(*checks: Check) -> Check:
    def check(workspace: Path, answer: str) -> tuple[bool, str]:
        for one in checks:
            ok, why = one(workspace, answer)
            if not ok:
                return ok, why
        return True, "; ".join(one(workspace, answer)[1] for one in checks)

    return check


def renamed(old: str, new: str, *names: str) -> Check:
    """`old` is in none of `names` any more, `new` in each."""

    def check(workspace: Path, answer: str) -> tuple[bool, str]:
        texts = {n: (workspace / n).read_text() if (workspace / n).is_file() else "" for n in names}
        left = [n for n, t in texts.items() if re.search(rf"\b{old}\b", t)]
        lacking = [n for n, t in texts.items() if new not in t]
        if left or lacking:
            return False, f"{old} still in {left}; {new} missing from {lacking}"
        return True, f"{old} renamed to {new} in {', '.join(names)}"

    return check


def edit(name: str, old: str, new: str) -> Callable[[Path], None]:
    def apply(workspace: Path) -> None:
        path = workspace / name
        path.write_text(path.read_text().replace(old, new))

    return apply


def solved(*steps: Callable[[Path], None], answer: str = "") -> Callable[[Path], str]:
    def solve(workspace: Path) -> str:
        for step in steps:
            step(workspace)
        return answer

    return solve


PY = sys.executable

# ---- the files ------------------------------------------------------------------------------------

CONFIG = "HOST = 'localhost'\nTIMEOUT = 30\nRETRIES = 3\n"
MATHUTILS = "def add(a, b):\n    return a + b\n"
TEST_MATHUTILS = (
    "from mathutils import add, multiply\n\n"
    "assert add(2, 3) == 5\nassert multiply(6, 7) == 42\nassert multiply(-2, 4) == -8\nprint('ok')\n"
)
BUGGY = "def is_even(n):\n    return n % 2 == 1\n"
TEST_BUGGY = "from buggy import is_even\n\nassert is_even(4)\nassert not is_even(7)\nprint('ok')\n"
SHAPES = "def area_of(width, height):\n    return width * height\n"
MAIN = "from shapes import area_of\n\nprint(area_of(3, 4))\n"
COMPUTE = "total = sum(i * i for i in range(1234)) % 99991\nprint(total)\n"
COMPUTED = str(sum(i * i for i in range(1234)) % 99991)
CSV = "id,name\n" + "".join(f"{i},item{i}\n" for i in range(1, 23))  # 23 lines
TODO = "write report\nbuy milk\ncall Ana\n"
APP_ENV = "PORT=8000\nMODE=prod\n"
LOGS = {
    "logs/app1.log": "INFO start\nINFO ready\n",
    "logs/app2.log": "INFO start\nERROR disk full\nINFO stop\n",
    "logs/app3.log": "WARN slow\nINFO stop\n",
}
PARSERS = {
    "reader.py": "from headers import parse_header\n\n\ndef read(path):\n"
    "    return parse_header(open(path).readline())\n",
    "headers.py": "def parse_header(line):\n    return line.strip().split(',')\n",
    "writer.py": "def write(path, fields):\n    open(path, 'w').write(','.join(fields))\n",
}
GREET = "def greet(name):\n    return f'Hi there, {name}!'\n"

TASKS = [
    Task(
        "read_answer",
        "What is the launch code written in notes.txt? Answer with the number.",
        {"notes.txt": "Meeting moved to Friday.\nThe launch code is 4471.\n"},
        says("4471"),
        solved(answer="The launch code is 4471."),
    ),
    Task(
        "find_definition",
        "Which file in this folder defines the function parse_header? Answer with the file name.",
        PARSERS,
        says("headers.py", absent=("writer.py",)),
        solved(answer="headers.py"),
    ),
    Task(
        "read_json_value",
        "Which port is set in settings.json? Answer with the number.",
        {"settings.json": '{"name": "api", "port": 8731, "debug": false}\n'},
        says("8731"),
        solved(answer="8731"),
    ),
    Task(
        "count_lines",
        "How many lines does data.csv have (the header included)? Answer with the number.",
        {"data.csv": CSV},
        says("23"),
        solved(answer="23"),
    ),
    Task(
        "list_txt_files",
        "Which files in this folder have names ending in .txt? List their names.",
        {"alpha.txt": "a\n", "beta.txt": "b\n", "gamma.md": "c\n"},
        says("alpha.txt", "beta.txt", absent=("gamma.md",)),
        solved(answer="alpha.txt and beta.txt"),
    ),
    Task(
        "grep_logs",
        "Which file in the logs folder contains the word ERROR? Answer with its name.",
        LOGS,
        says("app2", absent=("app1", "app3")),
        solved(answer="logs/app2.log"),
    ),
    Task(
        "function_result",
        "What does greet('Ada') return, with greet as defined in greet.py? Answer with the string.",
        {"greet.py": GREET},
        says("Hi there, Ada!"),
        solved(answer="Hi there, Ada!"),
    ),
    Task(
        "run_command",
        "Run `python3 compute.py` and tell me the number it prints.",
        {"compute.py": COMPUTE},
        says(COMPUTED),
        solved(answer=f"It prints {COMPUTED}."),
        kind="run",
    ),
    Task(
        "no_tool",
        "What is 17 + 25? Answer with just the number.",
        {"readme.txt": "Nothing to see here.\n"},
        both(says("42"), file_is("readme.txt", "Nothing to see here.\n")),
        solved(answer="42"),
        kind="none",
    ),
    Task(
        "change_line",
        "In config.py, change TIMEOUT from 30 to 60. Change nothing else.",
        {"config.py": CONFIG},
        file_is("config.py", CONFIG.replace("TIMEOUT = 30", "TIMEOUT = 60")),
        solved(edit("config.py", "TIMEOUT = 30", "TIMEOUT = 60")),
        kind="edit",
    ),
    Task(
        "create_file",
        "Create a file named hello.txt containing exactly this text: Hello, agent!",
        {},
        file_is("hello.txt", "Hello, agent!"),
        solved(lambda w: (w / "hello.txt").write_text("Hello, agent!\n")),
        kind="edit",
    ),
    Task(
        "delete_line",
        "Remove the line 'buy milk' from todo.txt and keep the other lines as they are.",
        {"todo.txt": TODO},
        file_is("todo.txt", "write report\ncall Ana\n"),
        solved(edit("todo.txt", "buy milk\n", "")),
        kind="edit",
    ),
    Task(
        "append_line",
        "Add the line DEBUG=false at the end of app.env, keeping the lines already there.",
        {"app.env": APP_ENV},
        file_is("app.env", APP_ENV + "DEBUG=false\n"),
        solved(lambda w: (w / "app.env").write_text(APP_ENV + "DEBUG=false\n")),
        kind="edit",
    ),
    Task(
        "add_function",
        "Add a function multiply(a, b) to mathutils.py so that `python3 test_mathutils.py` passes. "
        "Do not change test_mathutils.py.",
        {"mathutils.py": MATHUTILS, "test_mathutils.py": TEST_MATHUTILS},
        runs([PY, "test_mathutils.py"], {"test_mathutils.py": TEST_MATHUTILS}, out="ok"),
        solved(lambda w: (w / "mathutils.py").write_text(MATHUTILS + "\n\ndef multiply(a, b):\n    return a * b\n")),
        kind="edit",
    ),
    Task(
        "fix_bug",
        "is_even in buggy.py is wrong. Fix it so that `python3 test_buggy.py` passes. Do not change test_buggy.py.",
        {"buggy.py": BUGGY, "test_buggy.py": TEST_BUGGY},
        runs([PY, "test_buggy.py"], {"test_buggy.py": TEST_BUGGY}, out="ok"),
        solved(edit("buggy.py", "== 1", "== 0")),
        kind="edit",
    ),
    Task(
        "rename_symbol",
        "Rename the function area_of to compute_area, in shapes.py and in main.py.",
        {"shapes.py": SHAPES, "main.py": MAIN},
        both(runs([PY, "main.py"], {}, out="12"), renamed("area_of", "compute_area", "shapes.py", "main.py")),
        solved(edit("shapes.py", "area_of", "compute_area"), edit("main.py", "area_of", "compute_area")),
        kind="edit",
    ),
]
BY_NAME = {task.name: task for task in TASKS}
