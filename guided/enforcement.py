"""The enforcement report of a compiled JSON Schema: for every keyword that asserts something, how
decoding enforces it.

- "grammar": the engine's grammar allows only outputs that satisfy it (token by token);
- "validate-and-rollback": the grammar leaves it out; the decoder validates each value it governs
  when the value closes and rolls back on a violation (`guided.checker`);
- "not enforced": lenient mode only, neither can (an unknown format, a remote `$ref`); the final
  check still reports a violation (`GuidedResult.valid`).

Annotations (`title`, `description`, `default`, `examples`, `$comment`, ...), identifiers and keywords
unknown to the schema's draft are not listed: they assert nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from guided.compiler import CompiledGrammar
from guided.schema.pointer import pointer
from guided.schema.walk import subschemas
from guided.spec import JSON_KINDS

GRAMMAR, ROLLBACK, NOT_ENFORCED = "grammar", "validate-and-rollback", "not enforced"
# Keywords jsonschema checks inside another keyword's validator, and keywords that only hold others.
_ASSERTING = frozenset({"then", "else", "minContains", "maxContains"})
_NOT_ASSERTING = frozenset({"$defs", "definitions", "$ref", "$dynamicRef", "$recursiveRef", "$schema", "$id"})


@dataclass(frozen=True)
class KeywordEnforcement:
    """How one keyword occurrence is enforced: `keyword` at JSON `pointer` (of the keyword in the
    schema), `how` one of "grammar", "validate-and-rollback", "not enforced"; `tool`: the tool
    whose parameters hold it (the pointer is then into them), None for the answer's schema."""

    keyword: str
    pointer: str
    how: str
    tool: str | None = None


def enforcement(compiled: CompiledGrammar) -> tuple[KeywordEnforcement, ...]:
    """Every asserting keyword of a compiled JSON Schema with how it is enforced (schema order);
    () for regex, choices and grammars, which the grammar enforces whole."""
    spec = compiled.spec
    if spec.kind not in JSON_KINDS:
        return ()
    from guided.validation import validator_class

    known = set(validator_class(spec.schema).VALIDATORS) | _ASSERTING
    rollback = {(n.keyword, n.pointer) for n in compiled.validated}
    gaps = {(n.keyword, n.pointer) for n in compiled.not_enforced}
    report = []
    for path, sub in subschemas(spec.schema):
        if not isinstance(sub, dict):
            continue
        for keyword in sub:
            if keyword not in known or keyword in _NOT_ASSERTING:
                continue
            where = pointer(path + (keyword,))
            how = ROLLBACK if (keyword, where) in rollback else NOT_ENFORCED if (keyword, where) in gaps else GRAMMAR
            # inside a subschema the grammar left out (`/not/enum`), a keyword is enforced as that one is
            for outer in (gaps, rollback):
                if any(where.startswith(p + "/") for _, p in outer):
                    how = NOT_ENFORCED if outer is gaps else ROLLBACK
                    break
            report.append(KeywordEnforcement(keyword, where, how))
    return tuple(report)


def summary(report) -> list[tuple[str, str, int, list[str]]]:
    """[(keyword, how, occurrences, pointers)] grouped by keyword and how, validate-and-rollback and
    not-enforced rows first; a pointer into a tool's parameters names the tool ("/x/not (tool f)")."""
    counts = Counter((e.keyword, e.how) for e in report)
    order = {NOT_ENFORCED: 0, ROLLBACK: 1, GRAMMAR: 2}
    rows = []
    for (keyword, how), n in sorted(counts.items(), key=lambda kv: (order[kv[0][1]], kv[0][0])):
        where = [
            e.pointer + (f" (tool {e.tool})" if e.tool else "") for e in report if (e.keyword, e.how) == (keyword, how)
        ]
        rows.append((keyword, how, n, where))
    return rows
