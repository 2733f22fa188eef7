"""`coreai models list | path NAME | pull NAME | rm NAME`."""

from __future__ import annotations

from coreai import store


def register(sub) -> None:
    p = sub.add_parser("models", help="list, locate, pull (export) or remove registry models")
    p.add_argument("action", choices=("list", "path", "pull", "rm"))
    p.add_argument("name", nargs="?", help=f"registry name (default for path/pull: {store.DEFAULT_MODEL})")
    p.add_argument("--cache-dir", help="cache root (default: $COREAI_HOME or ~/.cache/coreai)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.action == "list":
        for entry in store.REGISTRY.values():
            folder = store.model_dir(entry.name, args.cache_dir)
            state = "exported" if (folder / "config.json").is_file() else "not exported"
            default = " (default)" if entry.name == store.DEFAULT_MODEL else ""
            print(f"{entry.name:32s} {state:13s} {entry.description}{default}")
        return 0
    name = args.name or store.DEFAULT_MODEL
    if args.action == "path":
        print(store.model_dir(name, args.cache_dir))
    elif args.action == "pull":
        print(store.ensure(name, args.cache_dir))
    elif args.action == "rm":
        folder = store.model_dir(name, args.cache_dir)
        if not folder.exists():
            print(f"{name} is not exported ({folder} does not exist)")
            return 0
        store.remove(name, args.cache_dir)
        print(f"removed {folder}")
    return 0
