"""Answer quality under constraint (issue 27): are constrained answers right, not only valid?

On the labelled extraction set (`benchmarks.extraction_data`: invoices, shipping addresses, calendar
events, contacts, product reviews), the default model (`coreai.load()`), greedy, runs these variants
side by side, interleaved document by document (the order rotates):

- `unconstrained+schema`: no grammar; the schema described in the system message
  (`guided.schema_prompt`); the answer is parsed as `parse_answer` says, unparsable counts as wrong;
- `constrained`: `ConstrainedSession(schema=...)`, the schema not in the prompt;
- `constrained+schema`: the same session with `schema_in_prompt=True`.

Per variant and domain: field accuracy (fields right after the scorer's normalisation), whole-record
accuracy (every field right), valid rate (the answer parses and validates against the schema, formats
checked), mean prompt / completion tokens and seconds per document. JSON (every answer included) and
a markdown table go to benchmarks/results/quality.{json,md}, rewritten after every document.
Every variant drafts with prompt lookup (an extraction copies the document; greedy output is the same
token for token with and without it, see `runtime.speculative`), so timings include that speed-up.

    python -m benchmarks.quality                  # the fixed sample: --per-domain 3 (15 documents)
    python -m benchmarks.quality --per-domain 2   # a quick look
    python -m benchmarks.quality --full           # all 300 documents (hours on a CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import coreai
from benchmarks.extraction_data import DOMAINS, FULL_PER_DOMAIN, Domain, Example, examples, score
from conformance.common import REPO, machine, md_table
from guided import ConstrainedSession, check_json
from guided.schema_prompt import describe_schema, with_schema_description

RESULTS = REPO / "benchmarks" / "results"
DEFAULT_PER_DOMAIN = 3  # 15 documents, 45 generations: about 15 minutes on an idle 2-core CPU
SYSTEM = (
    "You extract information from documents into JSON. Take every value from the document; "
    "do not invent values that are not there."
)
VARIANTS = ("unconstrained+schema", "constrained", "constrained+schema")
_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_answer(text: str):
    """The JSON value in an unconstrained answer, or None: the whole text if it parses; else the first
    markdown code fence's content; else the span from the first "{" to the last "}". Generous on
    purpose: the baseline is the best a caller could do with the text."""
    candidates = [text]
    fence = _FENCE.search(text)
    if fence:
        candidates.append(fence.group(1))
    if "{" in text and "}" in text:
        candidates.append(text[text.index("{") : text.rindex("}") + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    return None


def messages(example: Example, domain: Domain) -> list[dict]:
    """The chat every variant starts from: the system instruction, then the request and the document."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{domain.instruction}\n\n{example.document}"},
    ]


def run_one(model, sessions: dict, example: Example, variant: str, max_tokens: int) -> dict:
    """One document under one variant: the answer, its verdict and its per-field scores."""
    domain = DOMAINS[example.domain]
    chat = messages(example, domain)
    if variant == "unconstrained+schema":
        described = with_schema_description(chat, domain.schema)  # what schema_in_prompt=True sends
        result = model.generate(described, max_tokens=max_tokens, speculative="prompt_lookup")
        value = parse_answer(result.text)
        valid = value is not None and not check_json(json.dumps(value), domain.schema)[1]
    else:
        session = sessions[example.domain, variant]
        result = session.generate(chat, max_tokens=max_tokens, speculative="prompt_lookup")
        value, valid = (result.value, result.valid)
    fields = score(domain, value, example.truth)
    return {
        "id": example.id,
        "domain": example.domain,
        "variant": variant,
        "text": result.text,
        "finish_reason": result.finish_reason,
        "valid": bool(valid),
        "fields": fields,
        "record_correct": all(fields.values()),
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "seconds": result.timings.total,
    }


def summarise(records: list[dict]) -> dict:
    """{variant: {domain or "all": figures}} and per-field accuracy {variant: {domain: {field: rate}}}."""
    out: dict = {}
    per_field: dict = {}
    for variant in VARIANTS:
        mine = [r for r in records if r["variant"] == variant]
        out[variant] = {}
        per_field[variant] = {}
        for domain in [*dict.fromkeys(r["domain"] for r in mine), "all"]:
            rs = [r for r in mine if domain in ("all", r["domain"])]
            if not rs:
                continue
            n_fields = sum(len(r["fields"]) for r in rs)
            out[variant][domain] = {
                "documents": len(rs),
                "field_accuracy": sum(sum(r["fields"].values()) for r in rs) / n_fields,
                "record_accuracy": sum(r["record_correct"] for r in rs) / len(rs),
                "valid_rate": sum(r["valid"] for r in rs) / len(rs),
                "prompt_tokens": sum(r["prompt_tokens"] for r in rs) / len(rs),
                "completion_tokens": sum(r["completion_tokens"] for r in rs) / len(rs),
                "seconds": sum(r["seconds"] for r in rs) / len(rs),
            }
            if domain != "all":
                per_field[variant][domain] = {k: sum(r["fields"][k] for r in rs) / len(rs) for k in rs[0]["fields"]}
    return {"summary": out, "per_field": per_field}


def table(summary: dict) -> str:
    rows = []
    for variant, by_domain in summary.items():
        for domain, s in by_domain.items():
            rows.append(
                [variant, domain, s["documents"], f"{s['field_accuracy']:.1%}", f"{s['record_accuracy']:.1%}",
                 f"{s['valid_rate']:.0%}", round(s["prompt_tokens"]), round(s["completion_tokens"]), s["seconds"]]
            )  # fmt: skip
    header = ["variant", "domain", "docs", "field acc.", "record acc.", "valid", "prompt tok", "compl. tok", "s/doc"]
    return md_table(header, rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-domain", type=int, default=DEFAULT_PER_DOMAIN, help="documents per domain (sample)")
    parser.add_argument("--full", action="store_true", help=f"all {FULL_PER_DOMAIN} documents per domain")
    parser.add_argument("--domains", nargs="+", choices=list(DOMAINS), default=list(DOMAINS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--seed", type=int, default=0, help="the extraction set's seed")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", default=str(RESULTS / "quality.json"))
    args = parser.parse_args(argv)
    per_domain = FULL_PER_DOMAIN if args.full else args.per_domain
    # Round robin over the domains (invoice-0, shipping-0, ..., invoice-1, ...): a run stopped early
    # still covers every domain, and the file rewritten after each document says how far it got.
    docs = sorted(examples(per_domain, args.seed, args.domains), key=lambda e: e.id.rsplit("-", 1)[1])
    load_before = os.getloadavg()
    model = coreai.load()
    sessions = {}
    for name in args.domains:
        for variant, in_prompt in (("constrained", False), ("constrained+schema", True)):
            sessions[name, variant] = ConstrainedSession(model, schema=DOMAINS[name].schema, schema_in_prompt=in_prompt)
    records: list[dict] = []
    t0 = time.perf_counter()
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)

    def write() -> str:
        result = {
            "machine": machine(),
            "load_average": {"start": load_before, "now": os.getloadavg()},
            "wall_seconds": time.perf_counter() - t0,
            "model": coreai.store.DEFAULT_MODEL,
            "args": {**vars(args), "per_domain": per_domain},
            "complete": len(records) == len(docs) * len(args.variants),
            "system_prompt": SYSTEM,
            "schema_descriptions": {name: describe_schema(DOMAINS[name].schema) for name in args.domains},
            **summarise(records),
            "records": records,
        }
        with open(out, "w") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
        md = table(result["summary"])
        with open(os.path.splitext(out)[0] + ".md", "w") as f:
            f.write(f"python -m benchmarks.quality --per-domain {per_domain}\n\n{md}\n")
        return md

    for i, example in enumerate(docs):
        order = args.variants[i % len(args.variants) :] + args.variants[: i % len(args.variants)]
        for variant in order:  # rotated, so machine noise hits every variant alike
            records.append(run_one(model, sessions, example, variant, args.max_tokens))
            r = records[-1]
            log(f"{example.id} {variant:22s} fields {sum(r['fields'].values())}/{len(r['fields'])} "
                f"valid {r['valid']} {r['seconds']:.1f}s")  # fmt: skip
        md = write()
    print(md)
    log(f"wrote {out} ({time.perf_counter() - t0:.0f} s, load average now {os.getloadavg()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
