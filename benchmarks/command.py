"""`coreai bench MODEL [-p 512 -g 128 -n 3 --output-json FILE]`,
`coreai bench MODEL --guided SCHEMA_FILE [--prompt TEXT | --messages F.json] [-g N] [-n RUNS] [--output-json FILE]`
and, with `--speculative prompt_lookup|draft`, the same guided bench with the speculative variants (or,
without --guided, unconstrained decode with and without speculation on the prompt given).

The benchmarks register this command themselves (the `coreai.commands` entry point in pyproject.toml),
so the library never imports them (`coreai.cli` discovers it)."""

from __future__ import annotations

import json
from pathlib import Path

from coreai.commands import common


def register(sub) -> None:
    p = sub.add_parser("bench", help="prefill/decode tok/s, TTFT and peak memory, against mlx-lm in the same run")
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("-p", "--prompt-tokens", type=common.positive_int, default=512)
    p.add_argument(
        "-g", "--gen-tokens", type=common.positive_int, default=128, help="tokens to generate (guided: the max_tokens)"
    )
    p.add_argument("-n", "--runs", type=common.positive_int, default=3)
    p.add_argument(
        "--guided",
        type=Path,
        metavar="SCHEMA_FILE",
        help="end-to-end guided bench on this JSON Schema: unconstrained vs constrained decode tok/s, "
        "jump-forward on/off, TTFT with a cold compile",
    )
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt", help="the --guided/--speculative prompt (default: asks for a JSON value of the schema)"
    )
    prompt.add_argument(
        "--messages",
        type=Path,
        help="the --guided/--speculative prompt as a JSON list of chat messages "
        "(e.g. benchmarks/cases/*.messages.json)",
    )
    common.add_speculative_arg(p)
    p.add_argument("--output-json", type=Path)
    common.add_model_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    # Imported when the command runs, not when `coreai --help` builds the parsers (mlx-lm, MLX).
    from benchmarks.generation import format_guided_table, format_table, mismatches, run_bench, run_guided_bench

    speculative = None if args.speculative == "off" else args.speculative
    prompt = common.read_messages(args.messages) if args.messages else args.prompt
    schema = None
    if args.guided:
        try:
            text = args.guided.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read the schema file {args.guided}: {exc.strerror}") from None
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{args.guided}: not JSON ({exc})") from None
        prompt = prompt or f"Reply with a JSON value that matches this JSON Schema:\n{text.strip()}"
    elif speculative and not prompt:
        raise ValueError("--speculative without --guided needs --prompt or --messages (free text, no schema)")
    model = common.load_model(args)
    status = 0
    if args.guided or speculative:
        if schema is not None:
            from coreai import ConstrainedSession

            ConstrainedSession(model, schema=schema)  # an invalid or unenforceable schema fails here, before any timing
        report = run_guided_bench(model, [(prompt, schema)], args.gen_tokens, args.runs, speculative=speculative)
        print(format_guided_table(report))
        status = 1 if mismatches(report) else 0
    else:
        report = run_bench(model, args.prompt_tokens, args.gen_tokens, args.runs)
        print(format_table(report))
    if args.output_json:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        args.output_json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.output_json}")
    return status
