"""`coreai check-schema SCHEMA [--model MODEL] [grammar options]`: how each keyword is enforced.

Compiles a JSON Schema for a model's tokenizer and prints, for every keyword, whether the grammar
or validate-and-rollback enforces it, without running the model.
"""

from __future__ import annotations

import json

from coreai.commands.common import add_whitespace_arg


def register(sub) -> None:
    p = sub.add_parser(
        "check-schema",
        help="compile a JSON Schema and print how each keyword is enforced (no model run)",
        description=__doc__.split("\n\n", 1)[1].strip(),
    )
    p.add_argument("schema", help="JSON Schema file, or inline JSON")
    p.add_argument(
        "--model", default=None, help="registry name, MLX folder or repo id whose tokenizer to use (default: embedded)"
    )
    p.add_argument("--cache-dir", help="cache root (default: $COREAI_HOME or ~/.cache/coreai)")
    add_whitespace_arg(p)
    p.add_argument("--no-strict", action="store_true", help="allow properties the schema does not declare")
    p.add_argument("--lenient", action="store_true", help="list what cannot be enforced instead of refusing")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from coreai.api import resolve
    from coreai.store import DEFAULT_MODEL
    from guided import compile_grammar, enforcement, get_tokenizer_info, make_spec, summary
    from runtime import Tokenizer

    spec = make_spec(schema=args.schema, whitespace=args.whitespace, strict=not args.no_strict, lenient=args.lenient)
    folder = resolve(args.model or DEFAULT_MODEL, args.cache_dir)
    config = json.loads((folder / "config.json").read_text())
    tokenizer = Tokenizer(folder, config)
    info = get_tokenizer_info(tokenizer.hf, config["vocab_size"], tokenizer.eos_ids)
    compiled = compile_grammar(spec, info)
    report = enforcement(compiled)
    if args.json:
        keywords = [{"keyword": e.keyword, "pointer": e.pointer, "how": e.how} for e in report]
        print(json.dumps({"compile_ms": round(compiled.compile_seconds * 1e3, 2), "keywords": keywords}, indent=2))
        return 0
    print(f"compiled in {compiled.compile_seconds * 1e3:.1f} ms for the tokenizer of {folder.name}")
    rows = summary(report)
    if not rows:
        print("  no keywords: any JSON value is accepted")
    width = max([len(k) for k, *_ in rows] + [7])
    for keyword, how, n, pointers in rows:
        shown = ", ".join(pointers[:3]) + (f", ... ({n - 3} more)" if n > 3 else "")
        print(f"  {keyword:{width}s}  {how:21s}  {n:3d}  {shown}")
    return 0
