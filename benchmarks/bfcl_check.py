"""BFCL's data, its functions as OpenAI tools, and its AST checker (re-implemented from the rules the
data README states; `bfcl-eval` itself pulls a dozen provider SDKs). Used by `benchmarks.bfcl`.

An entry is one question of a category: `{"id", "messages", "functions", "answers"}`, where
`functions` are BFCL's function documents (types `dict`, `float`, `integer`, `string`, `boolean`,
`array`, `tuple`, `any`) and `answers` the ground truth, a list of `{function name: {param:
[acceptable values]}}` (one per expected call; `""` among the values: the parameter may be left out),
or None for `irrelevance` (the right answer is no call).

The checker follows BFCL's AST rules: the function name matches; every required parameter is present
and none the function or the answer does not know; each value has its declared type (an integer is
accepted for a float; a value of the acceptable values' own type is accepted too, as BFCL does for
answers written as variable names) and equals one of the acceptable values (strings compared after
`normalize`); a parameter the answer lists without `""` must be given; parallel calls are matched to
the answers in any order, the same number of each. Where BFCL stops at one level (it normalises
strings and accepts integers for floats only at the top of a list or dict, and matches parallel
calls greedily), this checker goes all the way down and finds a full matching if one exists: it is
never stricter than BFCL.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")

# BFCL's type names -> the Python type of a JSON-decoded value. `any` is checked as a string, as BFCL
# does (a value of the acceptable values' type passes too, see `check_call`).
PYTHON_TYPES = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
# BFCL's type names -> JSON Schema types; `any` gets no type.
JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
# BFCL's own keyword, not JSON Schema (a property's `"optional": true`; `required` already says it).
NOT_JSON_SCHEMA = ("optional",)


def load_category(data_dir: Path, category: str) -> list[dict]:
    """The entries of `category` from `data_dir` (BFCL_v4_<category>.json and, except for
    irrelevance, possible_answer/BFCL_v4_<category>.json), in file order.

    Raises ValueError for an unknown category, a question with more than one turn, or an answer
    whose id does not line up with its question; FileNotFoundError when a file is missing."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; expected one of {', '.join(CATEGORIES)}")
    questions = _lines(Path(data_dir) / f"BFCL_v4_{category}.json")
    answers = (
        None if category == "irrelevance" else _lines(Path(data_dir) / "possible_answer" / f"BFCL_v4_{category}.json")
    )
    entries = []
    for i, q in enumerate(questions):
        if len(q["question"]) != 1:
            raise ValueError(f"{q['id']}: {len(q['question'])} turns; these categories have one")
        if answers is not None and answers[i]["id"] != q["id"]:
            raise ValueError(f"answer {answers[i]['id']} does not line up with question {q['id']}")
        entries.append(
            {
                "id": q["id"],
                "messages": q["question"][0],
                "functions": q["function"],
                "answers": None if answers is None else answers[i]["ground_truth"],
            }
        )
    return entries


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tool_name(name: str) -> str:
    """A BFCL function name as an OpenAI tool name (`^[a-zA-Z0-9_-]{1,64}$`): dots and any other
    character outside that set become `_`, as BFCL does for OpenAI models."""
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64]


def to_openai_tools(functions: list[dict]) -> tuple[list[dict], dict[str, str]]:
    """BFCL function documents -> (OpenAI `tools`, {tool name: BFCL name}) for mapping calls back.

    Raises ValueError when two functions get the same tool name."""
    tools, names = [], {}
    for f in functions:
        name = tool_name(f["name"])
        if name in names:
            raise ValueError(f"functions {names[name]!r} and {f['name']!r} both become the tool name {name!r}")
        names[name] = f["name"]
        function = {
            "name": name,
            "description": f.get("description", ""),
            "parameters": to_json_schema(f["parameters"]),
        }
        tools.append({"type": "function", "function": function})
    return tools, names


def to_json_schema(schema: dict) -> dict:
    """One BFCL parameter schema -> JSON Schema (types renamed, `optional` dropped), recursively
    through `properties` and `items`."""
    out = {}
    for key, value in schema.items():
        if key in NOT_JSON_SCHEMA:
            continue
        if key == "type":
            mapped = JSON_TYPES.get(value, value)
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties":
            out["properties"] = {name: to_json_schema(s) for name, s in value.items()}
        elif key == "items" and isinstance(value, dict):
            out["items"] = to_json_schema(value)
        else:
            out[key] = value
    return out


def normalize(text: str) -> str:
    """A string as BFCL compares it: without spaces and the punctuation `,./-_*^`, lower-cased,
    single quotes as double quotes ("April 1, 2024" == "april 1 2024")."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _type_ok(value, schema: dict) -> bool:
    """Whether `value` (JSON-decoded) has the BFCL type `schema` declares, down through array items
    and dict properties; an integer passes for a float, a boolean never for a number."""
    declared = schema.get("type")
    if declared not in PYTHON_TYPES:
        return True
    if declared == "float" and type(value) is int:
        return True
    if type(value) is not PYTHON_TYPES[declared]:
        return False
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return all(_type_ok(v, schema["items"]) for v in value)
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        return all(_type_ok(v, properties[k]) for k, v in value.items() if k in properties)
    return True


def _equal(value, acceptable) -> bool:
    """Whether `value` equals one acceptable value: strings after `normalize`, lists item by item,
    a dict against BFCL's nested answer form `{key: [acceptable values]}`, numbers by value (1 == 1.0)
    but never a boolean for a number (`type(True)` is bool, not int)."""
    if isinstance(value, str) and isinstance(acceptable, str):
        return normalize(value) == normalize(acceptable)
    if isinstance(value, list) and isinstance(acceptable, list):
        return len(value) == len(acceptable) and all(_equal(v, a) for v, a in zip(value, acceptable, strict=False))
    if isinstance(value, dict) and isinstance(acceptable, dict):
        return _dict_error(value, acceptable) is None
    if type(value) in (int, float) and type(acceptable) in (int, float):
        return value == acceptable
    return type(value) is type(acceptable) and value == acceptable


def _among(value, acceptable: list) -> bool:
    return any(_equal(value, a) for a in acceptable)


def _dict_error(value: dict, answer: dict) -> str | None:
    """Why `value` does not match `answer` ({key: [acceptable values]}), or None when it does."""
    for key, v in value.items():
        if key not in answer:
            return f"unexpected key {key!r}"
        if not _among(v, answer[key]):
            return f"{key!r}: {v!r} is not one of {answer[key]!r}"
    for key, acceptable in answer.items():
        if key not in value and "" not in acceptable:
            return f"missing key {key!r}"
    return None


def check_call(function: dict, name: str, args: dict, answer: dict) -> str | None:
    """Why the call `name(**args)` does not match `answer` (`{function name: {param: [acceptable
    values]}}`) for the BFCL function document `function`, or None when it matches."""
    ((expected, params),) = answer.items()
    if name != expected:
        return f"called {name!r}, expected {expected!r}"
    properties = function["parameters"].get("properties", {})
    for param in function["parameters"].get("required", []):
        if param not in args:
            return f"missing required parameter {param!r}"
    for param, value in args.items():
        if param not in properties or param not in params:
            return f"unexpected parameter {param!r}"
        acceptable = params[param]
        # Answers written as variable names are strings for a non-string type: a value of the
        # acceptable values' own type passes the type check, as BFCL does.
        answer_type = next((type(a) for a in acceptable if a != ""), None)
        if not _type_ok(value, properties[param]) and type(value) is not answer_type:
            return f"{param!r}: {value!r} is not of type {properties[param].get('type')!r}"
        if not _among(value, acceptable):
            return f"{param!r}: {value!r} is not one of {acceptable!r}"
    for param, acceptable in params.items():
        if param not in args and "" not in acceptable:
            return f"missing parameter {param!r} (the answer has no default for it)"
    return None


def check(functions: list[dict], calls: list[tuple[str, dict]], answers: list[dict] | None) -> str | None:
    """Why `calls` ([(BFCL function name, arguments)]) are not a right answer, or None when they are.

    `answers` None (irrelevance): right only without calls. Otherwise the calls must match the answers
    one to one, in any order."""
    if answers is None:
        return None if not calls else f"{len(calls)} call(s) where no offered function fits"
    if len(calls) != len(answers):
        return f"{len(calls)} call(s), expected {len(answers)}"
    by_name = {f["name"]: f for f in functions}
    for answer in answers:
        (expected,) = answer
        if expected not in by_name:
            raise ValueError(f"the answer names {expected!r}, which is not among the functions")
    # errors[c][a]: why call c does not fit answer a (None: it fits).
    errors = [[check_call(by_name[next(iter(a))], name, args, a) for a in answers] for name, args in calls]
    if _matching([[e is None for e in row] for row in errors], 0, frozenset()):
        return None
    if len(answers) == 1:
        return errors[0][0]
    unmatched = [a for a in range(len(answers)) if all(row[a] for row in errors)]
    # For an answer no call fits, the reason given is the one of the call in the same position.
    reasons = "; ".join(f"answer {a}: {errors[min(a, len(calls) - 1)][a]}" for a in unmatched)
    return "no one-to-one match of the calls to the answers" + (f" ({reasons})" if reasons else "")


def _matching(fit: list[list[bool]], c: int, taken: frozenset[int]) -> bool:
    """Whether calls c.. can each take a distinct answer they fit, none of `taken` (backtracking;
    BFCL's parallel answers have a handful of calls)."""
    if c == len(fit):
        return True
    return any(ok and a not in taken and _matching(fit, c + 1, taken | {a}) for a, ok in enumerate(fit[c]))


# What a call written as text looks like: Hermes / Qwen markup, a JSON object with a "name" key, or
# (checked per function in `looks_like_call`) an offered function's name followed by "(".
_CALL_MARKUP = re.compile(r'<tool_call>|<\|python_tag\|>|\[TOOL_CALLS\]|<function=|"name"\s*:')


def looks_like_call(content: str | None, names: dict[str, str]) -> bool:
    """Whether reply text holds something that looks like a call (a call lost as text): call
    markup, a `"name":` key, or an offered function's name (tool or BFCL spelling) followed by `(`."""
    if not content:
        return False
    if _CALL_MARKUP.search(content):
        return True
    return any(re.search(re.escape(n) + r"\s*\(", content) for pair in names.items() for n in pair)


def text_calls(content: str | None, names: dict[str, str]) -> list[tuple[str, dict]]:
    """The calls written as JSON in reply text (a fenced ```json block or a bare object, alone or in
    a list): objects whose "name" is an offered function (tool or BFCL spelling) and whose
    "arguments" (or "parameters", Llama's key) is an object, as [(BFCL name, arguments)]."""
    by_name = {**{bfcl: bfcl for bfcl in names.values()}, **names}
    decoder, calls, i = json.JSONDecoder(), [], 0
    text = content or ""
    while (i := min((j for j in (text.find("{", i), text.find("[", i)) if j >= 0), default=-1)) >= 0:
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        for item in value if isinstance(value, list) else [value]:
            args = item.get("arguments", item.get("parameters")) if isinstance(item, dict) else None
            if isinstance(args, dict) and item.get("name") in by_name:
                calls.append((by_name[item["name"]], args))
        i = end
    return calls


def score_reply(entry: dict, tool_calls: list[tuple[str, str]], content: str | None) -> dict:
    """The outcome of one reply to `entry`: `tool_calls` as (tool name, arguments JSON text), as the
    OpenAI client returns them, and the reply's `content`.

    Returns {"outcome", "error", "call_in_text", "text_call_right"}. outcome: "right" (the checker's
    verdict; for irrelevance, no call), "no_call" (no tool call where one was due), "invalid" (a call
    to a function not offered, or arguments that are not a JSON object or break the tool's JSON
    Schema, unless the checker accepts them) or "wrong" (well-formed calls the checker rejects).
    call_in_text: no call was made and `content` looks like one (`looks_like_call`).
    text_call_right: no call was made where one was due, and the calls written as JSON in `content`
    (`text_calls`) would have been scored right: a right call lost as text."""
    import jsonschema

    tools, names = to_openai_tools(entry["functions"])
    if not tool_calls:
        in_text = looks_like_call(content, names)
        if entry["answers"] is None:
            return _scored("right", None, in_text)
        written = text_calls(content, names)
        lost = bool(written) and check(entry["functions"], written, entry["answers"]) is None
        return _scored("no_call", "no call", in_text, lost)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    calls, schema_errors = [], []
    for name, arguments in tool_calls:
        if name not in names:
            return _scored("invalid", f"call to {name!r}, not an offered tool")
        try:
            args = json.loads(arguments)
        except ValueError as e:
            return _scored("invalid", f"{name}: arguments are not JSON ({e})")
        if not isinstance(args, dict):
            return _scored("invalid", f"{name}: arguments are not a JSON object")
        found = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schemas[name]).iter_errors(args))
        if found is not None:
            schema_errors.append(f"{name}: {found.message}")
        calls.append((names[name], args))
    error = check(entry["functions"], calls, entry["answers"])
    # BFCL's verdict comes first: a few answers in the data break their own function's schema
    # (simple_python_307, parallel_152, parallel_multiple_21 and _94), and BFCL scores them right.
    if error is None:
        return _scored("right", None)
    if schema_errors:
        return _scored("invalid", "; ".join(schema_errors))
    return _scored("wrong", error)


def _scored(outcome: str, error: str | None, call_in_text: bool = False, text_call_right: bool = False) -> dict:
    return {"outcome": outcome, "error": error, "call_in_text": call_in_text, "text_call_right": text_call_right}
