"""Answer quality under constraint (issue 27): are constrained answers right, not only valid?

On the labelled extraction set (`benchmarks.extraction_data`: invoices, shipping addresses, calendar
events, contacts, product reviews), the default model (`coreai.load()`), greedy, runs these variants
side by side, interleaved document by document (the order rotates):

- `unconstrained+schema`: no grammar; the schema described in the system message
  (`guided.schema_prompt`, style "schema"); the answer is parsed as `parse_answer` says, unparsable
  counts as wrong;
- `constrained`: `ConstrainedSession(schema=..., whitespace="compact")`, nothing added to the
  prompt, compact JSON `{"key":"value"}` (the default until issue 27's second round);
- `constrained+schema`, `constrained+hints`: the same with `describe_schema(schema, style)` in the
  system message ("schema": every key; "hints": only the keys with a format, enum, pattern or range);
- `constrained+pretty`, `constrained+hints+pretty`: `whitespace="pretty"` (the default), so the
  model lays the JSON out as it does unconstrained (`{\n  "key": "value"`), within tight bounds;
- `constrained+ws`, `constrained+hints+ws`: `whitespace="any"`, looser bounds (up to 2 line breaks
  and 64 spaces between two tokens).

Per variant and domain: field accuracy (fields right after the scorer's normalisation), whole-record
accuracy (every field right), valid rate (the answer parses and validates against the schema, formats
checked), mean prompt / completion tokens and seconds per document. JSON (every answer included) and
a markdown table go to benchmarks/results/quality.{json,md}, rewritten after every document; the
variant that the shipped defaults run is marked `(default)`.
Every variant drafts with prompt lookup (an extraction copies the document; greedy output is the same
token for token with and without it, see `runtime.speculative`), so timings include that speed-up.

    python -m benchmarks.quality                  # the fixed sample (DEFAULT_PER_DOMAIN documents per domain)
    python -m benchmarks.quality --per-domain 2   # a quick look
    python -m benchmarks.quality --per-domain 10 --resume   # more documents, keeping those already run
    python -m benchmarks.quality --full           # all 300 documents (hours on a CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass

import coreai
from benchmarks.extraction_data import DOMAINS, FULL_PER_DOMAIN, Domain, Example, examples, score
from conformance.common import REPO, machine, md_table
from coreai import ConstrainedSession
from guided import check_json
from guided.schema_prompt import SCHEMA_IN_PROMPT, SCHEMA_PROMPT_STYLE, describe_schema, with_schema_description
from guided.spec import DEFAULT_WHITESPACE

RESULTS = REPO / "benchmarks" / "results"
DEFAULT_PER_DOMAIN = 2  # 10 documents x 4 variants: docs/reports/quality.md has the time and the standard errors
SYSTEM = (
    "You extract information from documents into JSON. Take every value from the document; "
    "do not invent values that are not there."
)


@dataclass(frozen=True)
class Variant:
    """constrained: through a `ConstrainedSession` (else plain `model.generate`); style: the
    `describe_schema` style put in the system message, or None for nothing; whitespace: the
    session's option of that name (`guided.spec.WHITESPACES`)."""

    name: str
    constrained: bool
    style: str | None
    whitespace: str = "compact"


VARIANTS = {
    v.name: v
    for v in (
        Variant("unconstrained+schema", False, "schema"),
        Variant("constrained", True, None),
        Variant("constrained+schema", True, "schema"),
        Variant("constrained+hints", True, "hints"),
        Variant("constrained+pretty", True, None, "pretty"),
        Variant("constrained+hints+pretty", True, "hints", "pretty"),
        Variant("constrained+ws", True, None, "any"),
        Variant("constrained+hints+ws", True, "hints", "any"),
    )
}
# The fixed sample's variants: unconstrained, the old compact default, the pretty layout alone and the
# shipped default (hints + pretty); the others lost on the samples in docs/reports/quality.md (--variants).
DEFAULT_VARIANTS = ("unconstrained+schema", "constrained", "constrained+pretty", "constrained+hints+pretty")
_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


def default_variant() -> str:
    """The name of the variant `ConstrainedSession(model, schema=...)` runs with the shipped defaults."""
    style = SCHEMA_PROMPT_STYLE if SCHEMA_IN_PROMPT else None
    return next(
        v.name for v in VARIANTS.values() if v.constrained and (v.style, v.whitespace) == (style, DEFAULT_WHITESPACE)
    )


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


def run_one(model, sessions: dict, example: Example, variant: Variant, max_tokens: int) -> dict:
    """One document under one variant: the answer, its verdict and its per-field scores. `sessions`:
    {(domain name, whitespace): ConstrainedSession with schema_in_prompt=False}; the variant's
    description is added here, as `ConstrainedSession.prompt` adds it with schema_in_prompt=True."""
    domain = DOMAINS[example.domain]
    chat = messages(example, domain)
    if variant.style is not None:
        chat = with_schema_description(chat, domain.schema, variant.style)
    if not variant.constrained:
        result = model.generate(chat, max_tokens=max_tokens, speculative="prompt_lookup")
        value = parse_answer(result.text)
        valid = value is not None and not check_json(json.dumps(value), domain.schema)[1]
    else:
        session = sessions[example.domain, variant.whitespace]
        result = session.generate(chat, max_tokens=max_tokens, speculative="prompt_lookup")
        value, valid = (result.value, result.valid)
    fields = score(domain, value, example.truth)
    return {
        "id": example.id,
        "domain": example.domain,
        "variant": variant.name,
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
        if not any(r["variant"] == variant for r in records):
            continue
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
                "fields": n_fields,
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
    """The markdown table; accuracies with a rough binomial standard error (sqrt(p(1-p)/n), n the
    fields or documents; fields of one document are not independent, so the field figure is low)."""
    rows = []
    default = default_variant()
    for variant, by_domain in summary.items():
        for domain, s in by_domain.items():
            n_fields, n = s["fields"], s["documents"]
            rows.append(
                [variant + " (default)" * (variant == default), domain, n,
                 f"{s['field_accuracy']:.1%} ± {_se(s['field_accuracy'], n_fields):.0%}",
                 f"{s['record_accuracy']:.0%} ± {_se(s['record_accuracy'], n):.0%}",
                 f"{s['valid_rate']:.0%}", round(s["prompt_tokens"]), round(s["completion_tokens"]), s["seconds"]]
            )  # fmt: skip
    header = ["variant", "domain", "docs", "field acc.", "record acc.", "valid", "prompt tok", "compl. tok", "s/doc"]
    return md_table(header, rows)


def _se(p: float, n: int) -> float:
    return (p * (1 - p) / n) ** 0.5 if n else 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-domain", type=int, default=DEFAULT_PER_DOMAIN, help="documents per domain (sample)")
    parser.add_argument("--full", action="store_true", help=f"all {FULL_PER_DOMAIN} documents per domain")
    parser.add_argument("--domains", nargs="+", choices=list(DOMAINS), default=list(DOMAINS))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(DEFAULT_VARIANTS))
    parser.add_argument("--seed", type=int, default=0, help="the extraction set's seed")
    parser.add_argument("--max-tokens", type=int, default=192, help="per answer (the longest right one is ~110)")
    parser.add_argument("--out", default=str(RESULTS / "quality.json"))
    parser.add_argument(
        "--resume", action="store_true", help="keep the answers already in --out (same seed and max tokens)"
    )
    args = parser.parse_args(argv)
    per_domain = FULL_PER_DOMAIN if args.full else args.per_domain
    # Round robin over the domains (invoice-0, shipping-0, ..., invoice-1, ...): a run stopped early
    # still covers every domain, and the file rewritten after each document says how far it got.
    docs = sorted(examples(per_domain, args.seed, args.domains), key=lambda e: e.id.rsplit("-", 1)[1])
    out = os.path.abspath(args.out)
    records = previous_records(out, args) if args.resume else []
    done = {(r["id"], r["variant"]) for r in records}
    load_before = os.getloadavg()
    model, sessions = None, {}
    if any((e.id, v) not in done for e in docs for v in args.variants):  # else only the report is rewritten
        model = coreai.load()
        sessions = {
            (name, ws): ConstrainedSession(model, schema=DOMAINS[name].schema, whitespace=ws, schema_in_prompt=False)
            for name in args.domains
            for ws in {VARIANTS[v].whitespace for v in args.variants if VARIANTS[v].constrained}
        }
    t0 = time.perf_counter()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    styles = sorted({VARIANTS[v].style for v in args.variants} - {None})

    def write() -> str:
        # The figures compare the variants on the same documents: those every variant has answered.
        paired = {e.id for e in docs if all((e.id, v) in done for v in args.variants)}
        result = {
            "machine": machine(),
            "load_average": {"start": load_before, "now": os.getloadavg()},
            "wall_seconds": time.perf_counter() - t0,
            "model": coreai.store.DEFAULT_MODEL,
            "args": {**vars(args), "per_domain": per_domain},
            "complete": all((e.id, v) in done for e in docs for v in args.variants),
            "paired_documents": len(paired),
            "default_variant": default_variant(),
            "system_prompt": SYSTEM,
            "schema_descriptions": {
                style: {name: describe_schema(DOMAINS[name].schema, style) for name in args.domains} for style in styles
            },
            **summarise([r for r in records if r["id"] in paired and r["variant"] in args.variants]),
            "records": records,
        }
        with open(out, "w") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
        md = table(result["summary"])
        with open(os.path.splitext(out)[0] + ".md", "w") as f:
            f.write(
                f"python -m benchmarks.quality --per-domain {per_domain} --variants {' '.join(args.variants)}\n\n{md}\n"
            )
        return md

    md = ""
    for i, example in enumerate(docs):
        order = args.variants[i % len(args.variants) :] + args.variants[: i % len(args.variants)]
        for name in order:  # rotated, so machine noise hits every variant alike
            if (example.id, name) in done:
                continue
            records.append(run_one(model, sessions, example, VARIANTS[name], args.max_tokens))
            done.add((example.id, name))
            r = records[-1]
            log(f"{example.id} {name:22s} fields {sum(r['fields'].values())}/{len(r['fields'])} "
                f"valid {r['valid']} {r['seconds']:.1f}s")  # fmt: skip
        md = write()
    print(md or write())
    log(f"wrote {out} ({time.perf_counter() - t0:.0f} s, load average now {os.getloadavg()})")
    return 0


def previous_records(path: str, args) -> list[dict]:
    """The answers of an earlier run in `path` to keep with --resume (every variant's): [] when there
    is none; raises SystemExit when it ran with another seed or token limit (its answers would not be
    comparable)."""
    try:
        with open(path) as f:
            previous = json.load(f)
    except FileNotFoundError:
        return []
    then = previous.get("args", {})
    if (then.get("seed"), then.get("max_tokens")) != (args.seed, args.max_tokens):
        raise SystemExit(f"--resume: {path} ran with seed {then.get('seed')}, max tokens {then.get('max_tokens')}")
    # All of them, not only this run's variants and domains: the file keeps the answers of every
    # variant run before (the figures are computed over this run's variants only).
    return previous["records"]


if __name__ == "__main__":
    raise SystemExit(main())
