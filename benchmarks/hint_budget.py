"""The schema hints' token budget (issue 39): the prompt tokens a schema description adds, with and
without the budget, on the default model's tokenizer, and whether the labelled extraction set's
prompts (docs/reports/quality.md) change under it.

    python -m benchmarks.hint_budget [--model qwen2.5-coder-0.5b-instruct] [--enum 3000] [--out FILE]

A labelled domain whose description is the same with the budget as without has the same prompt,
so the same greedy answers and the same field accuracy as measured; the script says which differ.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Which product did the customer order? They wrote: two of the blue mugs, paid in euros."


def enum_schema(n: int) -> dict:
    """A product-code schema: an n-value enum beside a small enum and a date."""
    codes = [f"SKU-{i:05d}" for i in range(n)]
    return {
        "type": "object",
        "properties": {
            "product": {"enum": codes},
            "currency": {"enum": ["EUR", "USD", "GBP"]},
            "ordered_on": {"type": "string", "format": "date"},
        },
        "required": ["product", "currency", "ordered_on"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--enum", type=int, default=3000, help="values of the large enum")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hint_budget.json")
    args = parser.parse_args(argv)

    from benchmarks.extraction_data import DOMAINS
    from coreai import ConstrainedSession
    from coreai.api import load
    from guided.prompt import describe_in_prompt
    from guided.schema_prompt import SCHEMA_HINT_BUDGET, SCHEMA_PROMPT_STYLE, describe_schema

    model = load(args.model)

    def count(text: str) -> int:
        return len(model.tokenizer.encode(text, add_special_tokens=False))

    session = ConstrainedSession(model, schema=enum_schema(args.enum))
    tokens = {
        name: len(model.prompt_ids(describe_in_prompt(session, QUESTION, **options)))
        for name, options in {
            "no_hints": dict(schema_in_prompt=False),
            "hints_budget": {},
            "hints_unbounded": dict(budget=10**9),
        }.items()
    }
    added = tokens["hints_budget"] - tokens["no_hints"]
    print(
        f"{args.enum}-value enum, prompt tokens: no hints {tokens['no_hints']}, hints within the budget "
        f"{tokens['hints_budget']} (+{added}, budget {SCHEMA_HINT_BUDGET}), hints unbounded "
        f"{tokens['hints_unbounded']} (+{tokens['hints_unbounded'] - tokens['no_hints']})"
    )
    domains = {}
    for name, domain in DOMAINS.items():
        full = describe_schema(domain.schema, SCHEMA_PROMPT_STYLE)
        kept = describe_schema(domain.schema, SCHEMA_PROMPT_STYLE, SCHEMA_HINT_BUDGET, count)
        domains[name] = {"tokens": count(full), "unchanged": kept == full}
        print(f"labelled domain {name}: description {count(full)} tokens, unchanged under the budget: {kept == full}")
    report = {
        "model": args.model,
        "enum_values": args.enum,
        "budget": SCHEMA_HINT_BUDGET,
        "prompt_tokens": tokens,
        "added_within_budget": added,
        "labelled_domains": domains,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if added <= SCHEMA_HINT_BUDGET and all(d["unchanged"] for d in domains.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
