"""`coreai bench MODEL [-p 512 -g 128 -n 3 --output-json FILE]`."""

from __future__ import annotations

import json
from pathlib import Path

from coreai.commands import common


def register(sub) -> None:
    p = sub.add_parser("bench", help="prefill/decode tok/s, TTFT and peak memory, against mlx-lm in the same run")
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("-p", "--prompt-tokens", type=int, default=512)
    p.add_argument("-g", "--gen-tokens", type=int, default=128)
    p.add_argument("-n", "--runs", type=int, default=3)
    p.add_argument("--output-json", type=Path)
    common.add_model_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from coreai.bench import format_table, run_bench

    model = common.load_model(args)
    report = run_bench(model, args.prompt_tokens, args.gen_tokens, args.runs)
    print(format_table(report))
    if args.output_json:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        args.output_json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.output_json}")
    return 0
