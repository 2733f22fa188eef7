"""The BFCL checker (`benchmarks.bfcl_check`): hand-made calls that BFCL's AST rules accept and
reject, the functions as OpenAI tools, reply scoring, and every ground-truth answer of the data
scored right (the checker checked against the data itself)."""

from __future__ import annotations

import json

import pytest

from benchmarks.bfcl_check import (
    CATEGORIES,
    check,
    load_category,
    looks_like_call,
    normalize,
    score_reply,
    text_calls,
    to_openai_tools,
)
from tests.conftest import SHARED_DATA

BFCL = SHARED_DATA / "bfcl"
needs_data = pytest.mark.skipif(not BFCL.is_dir(), reason=f"BFCL data not found at {BFCL}")

AREA = {
    "name": "geometry.area",
    "description": "Area of a shape.",
    "parameters": {
        "type": "dict",
        "properties": {
            "shape": {"type": "string"},
            "size": {"type": "float"},
            "count": {"type": "integer"},
            "exact": {"type": "boolean"},
            "unit": {"type": "string", "optional": True},
            "sides": {"type": "array", "items": {"type": "string"}},
            "origin": {"type": "dict", "properties": {"x": {"type": "integer"}, "label": {"type": "string"}}},
            "points": {"type": "array", "items": {"type": "dict", "properties": {"x": {"type": "float"}}}},
        },
        "required": ["shape", "size"],
    },
}
ANSWER = {
    "geometry.area": {
        "shape": ["Square", "box"],
        "size": [2.5, 3.0],
        "count": [1, ""],
        "exact": [True, ""],
        "unit": ["", "square meters"],
        "sides": [["North side", "south"], ""],
        "origin": [{"x": [0], "label": ["centre", ""]}, ""],
        "points": [[{"x": [1.0]}, {"x": [2.0]}], ""],
    }
}


def verdict(args: dict, name: str = "geometry.area") -> str | None:
    return check([AREA], [(name, args)], [ANSWER])


@pytest.mark.parametrize(
    "args",
    [
        {"shape": "square", "size": 2.5},
        {"shape": "SQUARE", "size": 3},  # an integer for a float; case and punctuation ignored
        {"shape": "Box", "size": 3.0, "count": 1, "exact": True, "unit": "Square-Meters"},
        {"shape": "box", "size": 2.5, "sides": ["north_side", "South"]},  # strings in a list normalised
        {"shape": "box", "size": 2.5, "origin": {"x": 0, "label": "Centre"}},
        {"shape": "box", "size": 2.5, "origin": {"x": 0}},  # a dict key the answer marks optional
        {"shape": "box", "size": 2.5, "points": [{"x": 1}, {"x": 2.0}]},
    ],
)
def test_right_calls(args):
    assert verdict(args) is None


@pytest.mark.parametrize(
    "args, name, reason",
    [
        ({"shape": "square", "size": 2.5}, "geometry_area", "called 'geometry_area'"),
        ({"shape": "square"}, "geometry.area", "missing required parameter 'size'"),
        ({"shape": "square", "size": 2.5, "colour": "red"}, "geometry.area", "unexpected parameter 'colour'"),
        ({"shape": "circle", "size": 2.5}, "geometry.area", "'shape': 'circle' is not one of"),
        ({"shape": "square", "size": 2.6}, "geometry.area", "'size': 2.6 is not one of"),
        ({"shape": "square", "size": 2.5, "count": 1.0}, "geometry.area", "not of type 'integer'"),
        ({"shape": "square", "size": 2.5, "count": True}, "geometry.area", "not of type 'integer'"),
        ({"shape": "square", "size": 2.5, "exact": 1}, "geometry.area", "not of type 'boolean'"),
        ({"shape": "square", "size": "2.5"}, "geometry.area", "not of type 'float'"),
        ({"shape": "square", "size": 2.5, "sides": ["south", "north side"]}, "geometry.area", "'sides'"),
        ({"shape": "square", "size": 2.5, "sides": ["north side"]}, "geometry.area", "'sides'"),
        ({"shape": "box", "size": 2.5, "origin": {"x": 1}}, "geometry.area", "'origin'"),
        ({"shape": "box", "size": 2.5, "origin": {"label": "centre"}}, "geometry.area", "'origin'"),
        ({"shape": "box", "size": 2.5, "origin": {"x": 0, "z": 1}}, "geometry.area", "'origin'"),
        ({"shape": "box", "size": 2.5, "points": [{"x": 1.0}]}, "geometry.area", "'points'"),
    ],
)
def test_wrong_calls(args, name, reason):
    error = verdict(args, name)
    assert error is not None and reason in error


def test_a_parameter_the_answer_needs_must_be_given():
    answer = {"geometry.area": {**ANSWER["geometry.area"], "count": [1]}}  # no "" among count's values
    error = check([AREA], [("geometry.area", {"shape": "box", "size": 2.5})], [answer])
    assert "missing parameter 'count'" in error


def test_a_variable_name_answer_accepts_the_name():
    """BFCL writes some values as variable names: a string for an integer parameter, compared as text."""
    answer = {"geometry.area": {"shape": ["box"], "size": [2.5], "count": ["n_shapes"]}}
    assert check([AREA], [("geometry.area", {"shape": "box", "size": 2.5, "count": "n_shapes"})], [answer]) is None
    assert check([AREA], [("geometry.area", {"shape": "box", "size": 2.5, "count": "m"})], [answer])


def test_parallel_calls_match_in_any_order_one_to_one():
    play = {
        "name": "play",
        "parameters": {"type": "dict", "properties": {"artist": {"type": "string"}}, "required": ["artist"]},
    }
    answers = [{"play": {"artist": ["Taylor Swift"]}}, {"play": {"artist": ["Maroon 5"]}}]
    a, b = ("play", {"artist": "taylor swift"}), ("play", {"artist": "Maroon 5"})
    assert check([play], [a, b], answers) is None
    assert check([play], [b, a], answers) is None
    assert "1 call(s), expected 2" in check([play], [a], answers)
    assert "3 call(s), expected 2" in check([play], [a, b, b], answers)
    assert "no one-to-one match" in check([play], [a, a], answers)  # one call cannot serve two answers


def test_parallel_matching_is_not_greedy():
    """Call 0 fits both answers, call 1 only the first: the only full matching gives call 0 the second."""
    f = {"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "integer"}}, "required": []}}
    answers = [{"f": {"x": [1, ""]}}, {"f": {"x": [""]}}]
    assert check([f], [("f", {}), ("f", {"x": 1})], answers) is None


def test_irrelevance_is_right_without_a_call():
    assert check([AREA], [], None) is None
    assert "where no offered function fits" in check([AREA], [("geometry.area", {"shape": "box"})], None)


def test_normalize_as_bfcl():
    assert normalize("April 1, 2024") == normalize("april 1 2024") == "april12024"
    assert normalize("it's") == 'it"s'
    assert normalize("a-b_c/d*e^f.g") == "abcdefg"


def test_functions_as_openai_tools():
    any_param = {"name": "x.y", "parameters": {"type": "dict", "properties": {"v": {"type": "any"}}}}
    tools, names = to_openai_tools([AREA, any_param])
    assert names == {"geometry_area": "geometry.area", "x_y": "x.y"}
    area = tools[0]["function"]
    assert tools[0]["type"] == "function" and area["name"] == "geometry_area"
    p = area["parameters"]
    assert p["type"] == "object" and p["required"] == ["shape", "size"]
    assert p["properties"]["size"] == {"type": "number"}
    assert p["properties"]["unit"] == {"type": "string"}  # BFCL's "optional" is not JSON Schema
    assert p["properties"]["origin"]["type"] == "object"
    assert p["properties"]["origin"]["properties"]["x"] == {"type": "integer"}
    assert p["properties"]["points"]["items"] == {"type": "object", "properties": {"x": {"type": "number"}}}
    assert tools[1]["function"]["parameters"]["properties"]["v"] == {}
    tuple_param = {"name": "t", "parameters": {"type": "dict", "properties": {"p": {"type": "tuple"}}}}
    assert to_openai_tools([tuple_param])[0][0]["function"]["parameters"]["properties"]["p"] == {"type": "array"}
    with pytest.raises(ValueError, match="both become the tool name 'x_y'"):
        to_openai_tools([any_param, {**any_param, "name": "x_y"}])


def entry(answers=(ANSWER,)):
    return {"id": "t", "messages": [], "functions": [AREA], "answers": list(answers)}


def test_score_reply_outcomes():
    right = score_reply(entry(), [("geometry_area", '{"shape": "box", "size": 2.5}')], None)
    assert right == {"outcome": "right", "error": None, "call_in_text": False, "text_call_right": False}
    wrong = score_reply(entry(), [("geometry_area", '{"shape": "circle", "size": 2.5}')], None)
    assert wrong["outcome"] == "wrong" and "'circle'" in wrong["error"]
    for calls, reason in [
        ([("geometry.area", "{}")], "not an offered tool"),  # the BFCL spelling is not the tool's name
        ([("geometry_area", '{"shape": ')], "not JSON"),
        ([("geometry_area", "[1]")], "not a JSON object"),
        ([("geometry_area", '{"shape": "box", "size": "big"}')], "'big' is not of type 'number'"),
    ]:
        scored = score_reply(entry(), calls, None)
        assert scored["outcome"] == "invalid" and reason in scored["error"], scored
    text = '```json\n{"name": "geometry_area", "arguments": {"shape": "box", "size": 2.5}}\n```'
    lost = {"outcome": "no_call", "error": "no call", "call_in_text": True, "text_call_right": True}
    assert score_reply(entry(), [], text) == lost
    wrong_in_text = score_reply(entry(), [], text.replace("box", "circle"))
    assert wrong_in_text["call_in_text"] and not wrong_in_text["text_call_right"]
    assert score_reply(entry(), [], "The area is 6.25.")["call_in_text"] is False
    assert score_reply({**entry(), "answers": None}, [], "I cannot help.")["outcome"] == "right"


def test_looks_like_call():
    names = {"geometry_area": "geometry.area"}
    assert looks_like_call('<tool_call>\n{"name": "geometry_area"}', names)
    assert looks_like_call("geometry.area(shape='box', size=2.5)", names)
    assert looks_like_call("[geometry_area (shape='box')]", names)
    assert not looks_like_call("Use geometry.area for this.", names)
    assert not looks_like_call(None, names)


def test_text_calls():
    """Calls written as JSON in reply text: fenced or bare, alone or in a list, either spelling of the
    name, "arguments" or Llama's "parameters"; other JSON is not a call."""
    names = {"geometry_area": "geometry.area"}
    text = (
        'Here: ```json\n[{"name": "geometry.area", "parameters": {"size": 1}}, {"name": "geometry_area", '
        '"arguments": {"size": 2}}]\n``` and {"name": "other", "arguments": {}} {"size": 3} {broken'
    )
    assert text_calls(text, names) == [("geometry.area", {"size": 1}), ("geometry.area", {"size": 2})]
    assert text_calls(None, names) == []


def test_unknown_category_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown BFCL category 'simple'"):
        load_category(tmp_path, "simple")


def _concrete(value):
    """One concrete value of a ground-truth value (BFCL's nested dicts hold lists of acceptable values)."""
    if isinstance(value, dict):
        return {k: _concrete(_first(v)) for k, v in value.items() if "" not in v}
    if isinstance(value, list):
        return [_concrete(v) for v in value]
    return value


def _first(acceptable: list):
    """The first acceptable value other than leaving the parameter out; None when that is all."""
    return next((v for v in acceptable if v != ""), None)


def _answer_calls(e: dict, pick) -> list[tuple[str, str]]:
    """The ground truth of `e` as tool calls (tool name, arguments JSON); `pick(i, param, acceptable,
    required)` gives the value for call i, or None to leave the parameter out. Parameters the function does not declare
    are left out (the data marks them optional)."""
    _, names = to_openai_tools(e["functions"])
    tool = {bfcl: name for name, bfcl in names.items()}
    declared = {f["name"]: f["parameters"]["properties"] for f in e["functions"]}
    required = {f["name"]: f["parameters"].get("required", []) for f in e["functions"]}
    calls = []
    for i, answer in enumerate(e["answers"]):
        ((name, params),) = answer.items()
        args = {}
        for param, acceptable in params.items():
            if param not in declared[name]:
                assert "" in acceptable, f"{e['id']}: {param} is neither declared nor optional"
                continue
            value = pick(i, param, acceptable, param in required[name])
            if value is not None:
                args[param] = _concrete(value)
        calls.append((tool[name], json.dumps(args)))
    return calls


@needs_data
@pytest.mark.parametrize("category", CATEGORIES)
def test_every_ground_truth_answer_is_scored_right(category):
    """Each answer of the data, as the calls a model would return, in order and reversed, with the
    first acceptable value of every parameter, with every other acceptable value of one parameter,
    and with every optional parameter left out, is scored right. (BFCL marks a few required parameters
    optional in the answer, `""`; a call without them is still wrong there, so they are kept.)"""
    entries = load_category(BFCL, category)
    assert len(entries) == {"simple_python": 400, "irrelevance": 240}.get(category, 200)
    checked = 0
    for e in entries:
        to_openai_tools(e["functions"])  # no two names collide
        if e["answers"] is None:
            assert score_reply(e, [], "")["outcome"] == "right"
            continue
        variants = [
            _answer_calls(e, lambda i, p, acceptable, req: _first(acceptable)),
            _answer_calls(
                e, lambda i, p, acceptable, req: None if "" in acceptable and not req else _first(acceptable)
            ),
        ]
        for k, answer in enumerate(e["answers"]):
            for param, acceptable in next(iter(answer.values())).items():
                for alternative in [v for v in acceptable if v != ""][1:]:
                    variants.append(
                        _answer_calls(
                            e, lambda i, p, a, req, k=k, q=param, v=alternative: v if (i, p) == (k, q) else _first(a)
                        )
                    )
        for calls in variants:
            for order in (calls, calls[::-1]):
                scored = score_reply(e, order, None)
                assert scored["outcome"] == "right", (e["id"], order, scored)
                checked += 1
    assert checked >= (0 if category == "irrelevance" else 2 * len(entries))


def test_benchmark_sample_and_summary():
    """`benchmarks.bfcl`'s fixed sample is evenly spaced, and its rates count each outcome once."""
    from benchmarks.bfcl import sample, summarize, table

    assert sample(list(range(400)), 4) == [0, 100, 200, 300]
    assert sample(list(range(3)), 10) == [0, 1, 2]
    outcomes = ["right", "right", "no_call", "no_call", "invalid", "wrong", "rejected", "right"]
    results = [
        {"outcome": o, "call_in_text": i in (2, 3), "text_call_right": i == 2, "seconds": float(i)}
        for i, o in enumerate(outcomes)
    ]
    s = summarize(results)
    assert (s["questions"], s["right"], s["no_call"], s["invalid"], s["wrong"], s["rejected"]) == (8, 3, 2, 1, 1, 1)
    assert (s["accuracy"], s["no_call_rate"], s["invalid_rate"]) == (3 / 8, 2 / 8, 1 / 8)
    assert (s["call_in_text"], s["right_in_text"]) == (2, 1)
    assert s["median_seconds"] == 3.5
    assert "| parallel | coreai | 8 | 38% (3) | 25% (2; 2 in text, 1 right) | 12% (1) | 1 | 1 | 3.5 |" in table(
        {"parallel": {"coreai": s}}
    )


@needs_data
def test_reused_answers_are_scored_again_and_must_all_be_there(tmp_path):
    """`--reuse`: the stored answers of a server not run, in the run's order, scored by today's
    checker (a stale stored outcome does not survive); another model or a missing answer is an error."""
    from benchmarks.bfcl import reused_answers, sample

    entries = {"simple_python": sample(load_category(BFCL, "simple_python"), 2)}
    first, second = entries["simple_python"]
    [answer] = first["answers"]
    name, values = next(iter(answer.items()))
    tools, names = to_openai_tools(first["functions"])
    tool = {bfcl: n for n, bfcl in names.items()}[name]
    args = {k: v[0] for k, v in values.items() if v and v[0] != ""}
    stored = [
        {"id": second["id"], "outcome": "right", "tool_calls": [], "content": "no call", "seconds": 1.0},
        {"id": first["id"], "outcome": "wrong", "tool_calls": [{"name": tool, "arguments": json.dumps(args)}]},
    ]
    settings = {"model": "m", "max_tokens": 400}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({**settings, "results": {"simple_python": {"mlx_lm": stored}}}))
    got = reused_answers([path], ["mlx_lm"], entries, settings)["simple_python"]["mlx_lm"]
    assert [(r["id"], r["outcome"]) for r in got] == [(first["id"], "right"), (second["id"], "no_call")]
    with pytest.raises(ValueError, match="max_tokens"):
        reused_answers([path], ["mlx_lm"], entries, {**settings, "max_tokens": 100})
    with pytest.raises(ValueError, match="no coreai answer"):
        reused_answers([path], ["coreai"], entries, settings)
