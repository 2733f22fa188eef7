"""A response format beside tools (OpenAI accepts both): the JSON Schema or json_object that the
text answer of a tools reply follows under tool_choice "auto" (and the whole reply under "none");
under "required" or a named function the reply is calls only and the format is not used.

The answer is a `%json` rule of the tools grammar (`guided.tools.tool_grammar`), compiled with the
options `guided.spec` chose for the schema alone, and checked whole against the schema with
`jsonschema` in the verdict. Validate-and-rollback (`guided.tools.check`) follows the tool calls only,
so a keyword of the answer's schema that the grammar cannot express is refused, by name.
"""

from __future__ import annotations

import json

from guided.cache import GrammarCache
from guided.enforcement import ROLLBACK, enforcement
from guided.errors import UnsupportedSchemaFeature
from guided.spec import GrammarSpec, make_spec
from guided.tokenizer_info import TokenizerInfo
from guided.tools.constraint import ToolConstraint
from runtime.errors import InputError


def answer_spec(schema, json_object: bool, others: tuple, **options) -> GrammarSpec | None:
    """The `GrammarSpec` of the answer's format (`schema` or `json_object`, with `make_spec`'s
    options), None for a free-text answer. others: the session's regex, choices and grammar, which
    cannot be an answer's format beside tools (ValueError); SchemaError for a bad schema."""
    if any(x is not None for x in others):
        raise InputError(
            "beside tools, the answer's format is a schema or json_object, not regex / choices / grammar", "answer"
        )
    if schema is None and not json_object:
        return None
    return make_spec(schema=schema, json_object=json_object, **options)


def answer_schema(spec: GrammarSpec | None) -> dict | None:
    """The engine's JSON Schema of a JSON spec (its options in `x-guidance`, as `guided.spec` chose
    them), for the `%json` rule of the tools grammar; None for None."""
    return None if spec is None else json.loads(spec.grammar)["grammars"][0]["json_schema"]


def checked_answer(
    spec: GrammarSpec | None, tools: ToolConstraint, tokenizer: TokenizerInfo, cache: GrammarCache
) -> GrammarSpec | None:
    """`spec` if the tools reply can answer in it (None under "required": calls only). Raises
    UnsupportedSchemaFeature (keyword, pointer) when the schema needs validate-and-rollback; the
    schema is compiled alone (cached) to find out."""
    if spec is None or not tools.answer_format:
        return None
    compiled = cache.get(spec, tokenizer)
    if compiled.checks is not None:
        e = next(e for e in enforcement(compiled) if e.how == ROLLBACK)
        raise UnsupportedSchemaFeature(
            f"cannot enforce {e.keyword} at {e.pointer} in a JSON answer beside tools: the grammar cannot express "
            'it, and validate-and-rollback follows the tool calls only (use tool_choice "none" for this format)',
            e.keyword,
            e.pointer,
        )
    return spec
