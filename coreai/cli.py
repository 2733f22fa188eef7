"""The `coreai` command line: `export`, `generate`, `check-schema`, `serve`, `bench`, `models`, `demo`.

Each subcommand lives in its own module `coreai/commands/<name>.py` with `register(subparsers)`,
which adds its parser and sets `func(args) -> int`. Errors of the library's hierarchy are printed as
one line on stderr with exit code 1, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from coreai.errors import ExportError, GrammarError, ModelNotFound

COMMANDS = ("models", "export", "generate", "check-schema", "bench", "serve", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coreai", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"coreai.commands.{name.replace('-', '_')}")
        except ModuleNotFoundError as exc:
            if exc.name != f"coreai.commands.{name.replace('-', '_')}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ModelNotFound, ExportError, GrammarError, ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"coreai {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"coreai {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
