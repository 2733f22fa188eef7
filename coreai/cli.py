"""The `coreai` command line: `export`, `generate`, `check-schema`, `serve`, `launch`, `bench`, `models`, `demo`.

Each built-in subcommand lives in its own module `coreai/commands/<name>.py` with `register(subparsers)`,
which adds its parser and sets `func(args) -> int`. Other packages add commands through the entry-point
group `coreai.commands` (a name -> its `register` function): `coreai bench` is registered so by the
`benchmarks` package, which the library never imports. Errors of the library's hierarchy are printed
as one line on stderr with exit code 1, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from importlib.metadata import entry_points

from coreai.errors import ExportError, GrammarError, ModelNotFound
from runtime.errors import InputError, ParameterError

COMMANDS = ("models", "export", "generate", "check-schema", "serve", "launch", "demo")
COMMAND_GROUP = "coreai.commands"  # entry points: name = "package.module:register"

# Commands other packages provide, and how to get them when they are not installed.
PROVIDED = {
    "bench": (
        "prefill/decode tok/s, TTFT and peak memory, against mlx-lm in the same run",
        "coreai bench is provided by the coreai-mlx benchmarks (the `benchmarks` package), which are not "
        "installed here: install coreai-mlx from a source checkout (`pip install -e .`, or `pip install "
        "-e '.[bench]'` for the peers of `make bench`)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coreai", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"coreai.commands.{name.replace('-', '_')}").register(sub)
    found = set()
    for entry in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        if entry.name in found or entry.name in COMMANDS:  # one registration per name; built-ins win
            continue
        entry.load()(sub)
        found.add(entry.name)
    for name, (summary, how) in PROVIDED.items():
        if name not in found:
            # Takes any arguments (no option prefix), so every call of it gets the message below.
            missing = sub.add_parser(name, help=f"{summary} (not installed)", add_help=False, prefix_chars="\0")
            missing.add_argument("arguments", nargs="*")
            missing.set_defaults(func=_not_installed(how))
    return parser


def _not_installed(how: str):
    def run(args) -> int:
        raise InputError(how)

    return run


def as_flag(exc: ParameterError, args: argparse.Namespace) -> str:
    """The message of a setting's error in the command line's words when a flag gave the setting
    ("max_batch must be >= 1" -> "--max-batch must be >= 1"), else as it is."""
    message = str(exc)
    if hasattr(args, exc.param) and message.startswith(exc.param):
        return "--" + exc.param.replace("_", "-") + message[len(exc.param) :]
    return message


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`coreai launch ... -- CLI ARGS`: the arguments before the first `--` and those after it (None
    without one, or for another command: argparse's subparsers do not pass `--` through)."""
    if "--" not in argv or "launch" not in argv[: argv.index("--")]:
        return argv, None
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def main(argv: list[str] | None = None) -> int:
    argv, passthrough = split_passthrough(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    if passthrough is not None:
        args.cli_args = [*args.cli_args, *passthrough]
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except ParameterError as exc:
        print(f"coreai {args.command}: error: {as_flag(exc, args)}", file=sys.stderr)
        return 1
    except (ModelNotFound, ExportError, GrammarError, ValueError, FileNotFoundError, FileExistsError) as exc:
        param = getattr(exc, "param", None)  # a refused request names the flag at fault (`coreai.service.request`)
        where = f"{param}: " if isinstance(param, str) and param.startswith("--") and param not in str(exc) else ""
        print(f"coreai {args.command}: error: {where}{exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"coreai {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
