"""The tool-call formats of `guided.tools.formats` on tiny random-weight models whose tokenizer carries
each family's marker tokens and whose chat template has its markup (small templates modelled on the
real ones), through `ConstrainedSession` and the server; and the parallel JSON calls small models
write under auto, on the tiny Qwen-style model."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from coreai import ConstrainedSession
from guided.errors import UnsupportedSchemaFeature
from guided.tools.calls import CallStream
from guided.tools.formats import FORMATS
from runtime import load_model
from tests.tool_defs import SEARCH, TOGGLE, UNIT, track

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (SEARCH, UNIT, TOGGLE)}
USER = [{"role": "user", "content": "Hi"}]
CHATML = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TOOLS_JSON = "{%- if tools %}{{- '<|im_start|>system\\n' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
# family: (its special tokens, a chat template with its call markup, two calls in its markup, where the
# first call's string argument holds markup-like text that must not end the call)
FAMILIES = {
    "mistral": (
        ("[TOOL_CALLS]", "[INST]", "[/INST]"),  # control tokens, as in Mistral's tokenizer
        "{%- for message in messages %}{%- if message.role == 'user' %}[INST] {{ message.content }}[/INST]"
        "{%- elif message.tool_calls %}[TOOL_CALLS] [{%- for c in message.tool_calls %}"
        '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}'
        "{%- if not loop.last %}, {% endif %}{%- endfor %}]<|im_end|>"
        "{%- else %}{{ message.content }}<|im_end|>{%- endif %}{%- endfor %}",
        '[TOOL_CALLS] [{"name": "search", "arguments": {"query": "a}], b"}}, '
        '{"name": "set_unit", "arguments": {"unit": "celsius"}}]',
    ),
    "mistral_names": (
        ("[TOOL_CALLS]", "[ARGS]", "[INST]", "[/INST]"),
        "{%- for message in messages %}{%- if message.role == 'user' %}[INST]{{ message.content }}[/INST]"
        "{%- elif message.tool_calls %}{%- for c in message.tool_calls %}[TOOL_CALLS]{{ c.function.name }}"
        "[ARGS]{{ c.function.arguments }}{%- endfor %}<|im_end|>"
        "{%- else %}{{ message.content }}<|im_end|>{%- endif %}{%- endfor %}",
        '[TOOL_CALLS]search[ARGS]{"query": "a}, set_unit{"}[TOOL_CALLS]set_unit[ARGS]{"unit": "celsius"}',
    ),
    "phi4": (
        (
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|end|>",
            "<|tool|>",
            "<|/tool|>",
            "<|tool_call|>",
            "<|/tool_call|>",
        ),
        "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] "
        "is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + "
        "'<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}",
        '<|tool_call|>[{"name": "search", "arguments": {"query": "a}] b"}}, '
        '{"name": "set_unit", "arguments": {"unit": "celsius"}}]<|/tool_call|>',
    ),
    "llama3": (
        ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"),
        "{%- for message in messages %}{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}"
        "{%- if message.tool_calls %}{{- '<|python_tag|>' }}{%- for c in message.tool_calls %}"
        '{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments }}}'
        "{%- if not loop.last %}; {% endif %}{%- endfor %}{%- else %}{{- message.content }}{%- endif %}"
        "{{- '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}",
        '<|python_tag|>{"name": "search", "parameters": {"query": "a}; {"}}; '
        '{"name": "set_unit", "parameters": {"unit": "celsius"}}',
    ),
    "pythonic": (
        (),
        "{%- if tools %}{{- '<|im_start|>system\\nHere is a list of functions in JSON format that you can invoke:\\n'"
        " + (tools | tojson) + '\\nReply in the format [func_name1(params_name1=params_value1, "
        "params_name2=params_value2...), func_name2(params)]<|im_end|>\\n' }}{%- endif %}" + CHATML,
        '[search(query="a), set_unit(unit=\'b\')]"), set_unit(unit="celsius")]',
    ),
    "qwen3_coder": (
        (),
        TOOLS_JSON + "{{- 'Call tools as <tool_call>\\n<function=name>\\n<parameter=p>\\nvalue\\n</parameter>\\n"
        "</function>\\n</tool_call>' }}" + CHATML,
        "<tool_call>\n<function=search>\n<parameter=query>\na </function>\n</parameter> b\n</parameter>\n</function>\n"
        "</tool_call>\n<tool_call>\n<function=set_unit>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n"
        "</tool_call>",
    ),
    "glm45": (
        ("<|system|>", "<|user|>", "<|assistant|>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
        TOOLS_JSON.replace("<|im_start|>system\\n", "<|system|>").replace("<|im_end|>\\n", "")
        + "{%- for m in messages %}{%- if m.role == 'user' %}<|user|>\n{{ m.content }}"
        "{%- elif m.role == 'assistant' %}<|assistant|>{%- for tc in m.tool_calls or [] %}"
        "\n<tool_call>{{ tc.function.name }}{%- for k, v in tc.function.arguments.items() %}\n<arg_key>{{ k }}"
        "</arg_key>\n<arg_value>{{ v | tojson if v is not string else v }}</arg_value>{%- endfor %}\n</tool_call>"
        "{%- endfor %}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|assistant|>{%- endif %}",
        "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>a </tool_call b\n<arg_key</arg_value>\n"
        "</tool_call>\n<tool_call>set_unit\n<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n</tool_call>",
    ),
    "kimi_k2": (
        (
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        ),
        "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}"
        "{%- for m in messages -%}{%- if m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ m.content }}<|im_end|>"
        "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>{%- if m.tool_calls -%}"
        "<|tool_calls_section_begin|>{%- for tc in m.tool_calls -%}<|tool_call_begin|>{{ tc.id }}"
        "<|tool_call_argument_begin|>{{ tc.function.arguments | tojson }}<|tool_call_end|>{%- endfor -%}"
        "<|tool_calls_section_end|>{%- else -%}{{ m.content }}{%- endif -%}<|im_end|>{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>"
        '{"query": "a}, functions.set_unit:1 b"}<|tool_call_end|><|tool_call_begin|>functions.set_unit:1'
        '<|tool_call_argument_begin|>{"unit": "celsius"}<|tool_call_end|><|tool_calls_section_end|>',
    ),
    "lfm2": (
        ("<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>", "<|tool_call_end|>"),
        "{%- if tools -%}<|im_start|>system\nList of tools: <|tool_list_start|>{{ tools | tojson }}"
        "<|tool_list_end|><|im_end|>\n{%- endif -%}" + CHATML,
        '<|tool_call_start|>[search(query="a), set_unit(unit=\'b\')]"), set_unit(unit="celsius")]<|tool_call_end|>',
    ),
}
FIRST_QUERY = {
    "mistral": "a}], b",
    "mistral_names": "a}, set_unit{",
    "phi4": "a}] b",
    "llama3": "a}; {",
    "pythonic": "a), set_unit(unit='b')]",
    "qwen3_coder": "a </function>\n</parameter> b",
    "glm45": "a </tool_call b\n<arg_key",
    "kimi_k2": "a}, functions.set_unit:1 b",
    "lfm2": "a), set_unit(unit='b')]",
}


@pytest.fixture(scope="module")
def family_model(tmp_path_factory, write_tiny_tokenizer, write_tiny_network):
    """format name -> a tiny random qwen2 network with that family's tokens and template (built once)."""
    built = {}

    def build(fmt: str):
        if fmt not in built:
            folder = tmp_path_factory.mktemp(f"tiny-{fmt}")
            tokens, template = FAMILIES[fmt][:2]
            control = tokens if fmt.startswith("mistral") else ()  # the others are added tokens
            write_tiny_tokenizer(
                folder, added=tuple(t for t in tokens if t not in control), chat_template=template, special=control
            )
            write_tiny_network(folder, "qwen2")
            built[fmt] = load_model(folder)
        return built[fmt]

    return build


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, family_model):
    return request.param, family_model(request.param)


def _ids(session, text: str) -> list[int]:
    """Token ids of `text` with the format's markers as their special tokens, the rest as text."""
    hf, ll = session.model.tokenizer.hf, session.tokenizer_info.ll_tokenizer
    markers = [m for m in FORMATS[session.tools.fmt].markers if m in hf.get_vocab()]
    ids = []
    for piece in re.split("(" + "|".join(map(re.escape, markers)) + ")", text) if markers else [text]:
        ids += [hf.convert_tokens_to_ids(piece)] if piece in markers else ll.tokenize_str(piece) if piece else []
    return ids


def _forced(session, text: str):
    """Feed `text`'s tokens to a fresh matcher and to the session's call tracker as the answer:
    (the grammar accepts the whole text, calls, streamed events)."""
    ids = _ids(session, text)
    matcher = session.compiled.matcher()
    accepted = matcher.accept_tokens(ids) and matcher.is_accepting()
    calls, labels = track(session, ids)
    hf = session.model.tokenizer.hf
    parts = [(label, hf.decode([t])) for t, label in zip(ids, labels, strict=False)]
    stream = CallStream(session.tools)
    events = stream.feed(parts) + stream.finish(calls)
    for call in calls:  # what every forced call must satisfy
        assert json.loads(call.arguments) == call.args
        assert ("open", call.index, call.name) in events and _fragments(events, call.index) == call.arguments
    return accepted, calls, labels


def _fragments(events, index: int) -> str:
    return "".join(e[2] for e in events if e[0] == "args" and e[1] == index)


def test_format_detected_from_the_template(family):
    fmt, model = family
    assert ConstrainedSession(model, tools=[SEARCH]).tools.fmt == fmt


def test_two_calls_parse_with_markup_inside_an_argument(family):
    """Two calls in the family's markup, under auto: the grammar takes them, each call's boundaries
    are the grammar's (the markup-like text stays inside the first argument), the arguments
    validate, and the streamed fragments concatenate to each call's arguments."""
    fmt, model = family
    session = ConstrainedSession(model, tools=[SEARCH, UNIT])
    accepted, calls, _ = _forced(session, FAMILIES[fmt][2])
    assert accepted
    assert [(c.name, c.args) for c in calls] == [
        ("search", {"query": FIRST_QUERY[fmt]}),
        ("set_unit", {"unit": "celsius"}),
    ]
    for call in calls:
        jsonschema.validate(call.args, SCHEMAS[call.name])


def test_parallel_false_takes_one_call(family):
    fmt, model = family
    session = ConstrainedSession(model, tools=[SEARCH, UNIT], tool_choice="required", parallel_tool_calls=False)
    accepted, _, _ = _forced(session, FAMILIES[fmt][2])
    assert not accepted


def test_none_cannot_start_a_call(family):
    fmt, model = family
    session = ConstrainedSession(model, tools=[SEARCH, UNIT], tool_choice="none")
    opener = FORMATS[fmt].opener
    if opener is not None:
        assert not session.matcher.accept_token(model.tokenizer.hf.convert_tokens_to_ids(opener))
    else:
        accepted, _, _ = _forced(session, FAMILIES[fmt][2])
        assert not accepted
    assert session.generate(USER, max_tokens=8).tool_calls == []


@pytest.mark.parametrize("parallel", [True, False])
def test_required_generation_streams_the_whole_arguments(family, parallel):
    """The random network under "required": calls in the family's format that validate, streamed
    fragments that concatenate to the whole reply's arguments."""
    fmt, model = family
    session = ConstrainedSession(model, tools=[UNIT, TOGGLE], tool_choice="required", parallel_tool_calls=parallel)
    # The random network rarely picks an end id (its head rows are zero) and may go on listing calls:
    # a bias on the end ids and on the tokens that close a list or a fence lets it end where the
    # grammar allows.
    ends = [t for t, i in model.tokenizer.hf.get_vocab().items() if "]" in t or "`" in t] if parallel else []
    bias = {i: 6.0 for i in [*model.tokenizer.eos_ids, *(model.tokenizer.hf.convert_tokens_to_ids(ends))]}
    deltas = list(session.stream(USER, max_tokens=200, logit_bias=bias))
    result = deltas[-1].result
    assert result.finish_reason == "stop" and result.valid, result.errors
    assert result.tool_calls and (parallel or len(result.tool_calls) == 1)
    stream = CallStream(session.tools)
    events = [e for d in deltas for e in stream.feed(d.parts)] + stream.finish(result.tool_calls)
    for call in result.tool_calls:
        jsonschema.validate(call.args, SCHEMAS[call.name])
        assert ("open", call.index, call.name) in events and _fragments(events, call.index) == call.arguments


def test_named_function_is_exactly_one_call(family):
    _, model = family
    choice = {"type": "function", "function": {"name": "toggle"}}
    result = ConstrainedSession(model, tools=[UNIT, TOGGLE], tool_choice=choice).generate(USER, max_tokens=120)
    assert result.valid, result.errors
    assert [c.name for c in result.tool_calls] == ["toggle"] and isinstance(result.tool_calls[0].args["on"], bool)


TYPED = {
    "type": "function",
    "function": {
        "name": "typed",
        "parameters": {
            "type": "object",
            "properties": {
                "n": {"type": "integer"},
                "x": {"type": "number"},
                "on": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "opts": {"type": "object", "properties": {"k": {"type": "integer"}}},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
            "required": ["n"],
        },
    },
}
TYPED_ARGS = {"n": 3, "x": 1.5, "on": True, "tags": ["a", "b"], "opts": {"k": 1}, "note": None}


def test_pythonic_values_by_parameter_type(family_model):
    """Python literals per parameter type (True/False, None, lists, dicts, either quote), converted
    to JSON arguments; optional parameters may be left out, in order; a wrong type is refused."""
    session = ConstrainedSession(family_model("pythonic"), tools=[TYPED, SEARCH])
    text = '[typed(n=3, x=1.5, on=True, tags=["a", \'b\'], opts={"k": 1}, note=None), typed(n=-2, on=False)]'
    accepted, calls, labels = _forced(session, text)
    assert accepted and None not in labels
    assert [c.args for c in calls] == [TYPED_ARGS, {"n": -2, "on": False}]
    assert calls[0].arguments == json.dumps(TYPED_ARGS)
    for wrong in ('[typed(n="3")]', "[typed(x=1.5)]", "[typed(on=True, n=3)]", "[typed(n=3, on=true)]"):
        assert not _forced(session, wrong)[0], wrong


def test_qwen3_coder_values_by_parameter_type(family_model):
    """String parameters as raw text, the others as JSON, converted to JSON arguments."""
    session = ConstrainedSession(family_model("qwen3_coder"), tools=[TYPED], tool_choice="required")
    values = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n" for k, v in TYPED_ARGS.items()
    )
    accepted, calls, _ = _forced(session, f"<tool_call>\n<function=typed>\n{values}</function>\n</tool_call>")
    assert accepted and [c.args for c in calls] == [TYPED_ARGS]
    text = "<tool_call>\n<function=typed>\n<parameter=n>\nthree\n</parameter>\n</function>\n</tool_call>"
    assert not _forced(session, text)[0]


def test_glm45_values_by_parameter_type(family_model):
    """GLM-4.5: string parameters as raw text (as its template writes them), the others as JSON; an
    empty string is a value; the closing marker spelled as text cannot end a raw value early."""
    session = ConstrainedSession(family_model("glm45"), tools=[TYPED, SEARCH], tool_choice="required")
    pair = "<arg_key>{}</arg_key>\n<arg_value>{}</arg_value>\n"
    values = "".join(pair.format(k, v if isinstance(v, str) else json.dumps(v)) for k, v in TYPED_ARGS.items())
    text = f"<tool_call>typed\n{values}</tool_call>\n<tool_call>search\n{pair.format('query', '')}</tool_call>"
    accepted, calls, _ = _forced(session, text)
    assert accepted and [c.args for c in calls] == [TYPED_ARGS, {"query": ""}]
    assert not _forced(session, f"<tool_call>typed\n{pair.format('n', 'three')}</tool_call>")[0]
    hf, ll = session.model.tokenizer.hf, session.tokenizer_info.ll_tokenizer
    spelled = [hf.convert_tokens_to_ids("<tool_call>"), *ll.tokenize_str("search\n")]
    spelled += [hf.convert_tokens_to_ids("<arg_key>"), *ll.tokenize_str("query")]
    spelled += [hf.convert_tokens_to_ids("</arg_key>"), *ll.tokenize_str("\n")]
    spelled += [hf.convert_tokens_to_ids("<arg_value>"), *ll.tokenize_str("a</arg_value>")]
    assert not session.compiled.matcher().accept_tokens(spelled)


# -- the JSON calls small models write under auto (the tiny Qwen-style model, hermes) ----------------

CALL_A = '{"name": "search", "arguments": {"query": "a"}}'
CALL_B = '{"name": "set_unit", "arguments": {"unit": "celsius"}}'
# form: (two calls, one call) as small models write them
PARALLEL_FORMS = {
    "fenced blocks": (f"```json\n{CALL_A}\n```\n\n```json\n{CALL_B}\n```", f"```json\n{CALL_A}\n```"),
    "array": (f"[{CALL_A}, {CALL_B}]", f"[{CALL_A}]"),
    # One fence, a call per line: what the 0.5B model's top choice is after its first fenced call
    # (docs/reports/bfcl.md, the parallel decision point).
    "fenced lines": (f"```json\n{CALL_A}\n{CALL_B}\n```", f"```json\n{CALL_A}\n```"),
    "fenced array": (f"```json\n[\n  {CALL_A},\n  {CALL_B}\n]\n```", f"```json\n[\n  {CALL_A}\n]\n```"),
    "bare lines": (f"{CALL_A}\n{CALL_B}", CALL_A),
    "hermes blocks": (
        f"<tool_call>\n{CALL_A}\n</tool_call>\n<tool_call>\n{CALL_B}\n</tool_call>",
        f"<tool_call>\n{CALL_A}\n</tool_call>",
    ),
}


@pytest.mark.parametrize("form", list(PARALLEL_FORMS))
def test_auto_parallel_forms_are_several_calls(tiny_model, form):
    """Under auto with parallel_tool_calls, each form small models write for several calls comes
    back as that many tool calls (no content); with parallel_tool_calls false only one call."""
    two, one = PARALLEL_FORMS[form]
    session = ConstrainedSession(tiny_model, tools=[SEARCH, UNIT])
    accepted, calls, labels = _forced(session, two)
    assert accepted and None not in labels
    assert [(c.name, c.args) for c in calls] == [("search", {"query": "a"}), ("set_unit", {"unit": "celsius"})]
    single = ConstrainedSession(tiny_model, tools=[SEARCH, UNIT], parallel_tool_calls=False)
    assert not _forced(single, two)[0]
    accepted, calls, _ = _forced(single, one)
    assert accepted and [c.name for c in calls] == ["search"]


def test_identical_calls_in_a_row_are_two_calls(tiny_model):
    """llguidance drops a capture equal to the previous one of its name unless the name says to
    append: the same call twice (a parallel question asking for it twice) is two calls."""
    session = ConstrainedSession(tiny_model, tools=[SEARCH, UNIT])
    for text in (f"{CALL_A}\n{CALL_A}", f"<tool_call>\n{CALL_A}\n</tool_call>\n<tool_call>\n{CALL_A}\n</tool_call>"):
        accepted, calls, _ = _forced(session, text)
        assert accepted and [c.args for c in calls] == [{"query": "a"}, {"query": "a"}]


def test_auto_json_inside_prose_is_text(tiny_model):
    session = ConstrainedSession(tiny_model, tools=[SEARCH, UNIT])
    accepted, calls, labels = _forced(session, f"Like this: {CALL_A}\n[{CALL_B}]")
    assert accepted and calls == [] and set(labels) == {None}


# -- the server, with the official openai client ----------------------------------------------------


@pytest.fixture(scope="module", params=["mistral", "pythonic", "glm45", "kimi_k2"])
def family_server(request, family_model):
    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    config = ServerConfig(model_name="tiny", max_tokens=200, temperature=0.0)
    with serve_in_thread(family_model(request.param), config) as base:
        yield base, request.param


def test_server_calls_whole_and_streamed(family_server):
    """A non-hermes format through the server: the whole reply's call validates; the streamed one
    (greedy: the same output) opens the call with its id and name, then its fragments concatenate
    to the whole reply's arguments; no content."""
    import openai

    base, fmt = family_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    body = dict(
        model="tiny",
        messages=USER,
        tools=[UNIT, TOGGLE],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
    )
    whole = client.chat.completions.create(**body).choices[0]
    assert whole.finish_reason == "tool_calls" and len(whole.message.tool_calls) == 1
    call = whole.message.tool_calls[0].function
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    chunks = [c for c in client.chat.completions.create(**body, stream=True) if c.choices]
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # Kimi writes the ids of calls in its markup itself (`functions.name:idx`); JSON calls get ours.
    ids = rf"call_[0-9a-f]+|functions\.{call.name}:\d+" if fmt == "kimi_k2" else r"call_[0-9a-f]+"
    assert re.fullmatch(ids, deltas[0].id) and re.fullmatch(ids, whole.message.tool_calls[0].id)
    assert deltas[0].function.name == call.name
    assert "".join(d.function.arguments or "" for d in deltas) == call.arguments
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)


@pytest.mark.parametrize("fmt", ["pythonic", "qwen3_coder", "mistral_names"])
def test_keywords_left_to_validate_and_rollback_are_refused_where_calls_are_not_json(family_model, fmt):
    """The call checker follows JSON call envelopes only: a format whose calls are not JSON refuses
    a keyword the grammar leaves to validate-and-rollback, by name, instead of dropping it."""
    tags = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    }
    tool = {"type": "function", "function": {"name": "tag", "parameters": tags}}
    with pytest.raises(UnsupportedSchemaFeature) as error:
        ConstrainedSession(family_model(fmt), tools=[tool])
    e = error.value
    assert (e.keyword, e.pointer, e.tool) == ("uniqueItems", "/properties/tags/uniqueItems", "tag"), e
    assert fmt in str(e)
    assert ConstrainedSession(family_model(fmt), tools=[tool], tool_format="generic").call_plans


@pytest.mark.parametrize(
    "fmt, call",
    [
        ("llama3", '{"name": "set_unit", "parameters": {"unit": "celsius"}}'),  # its calls are bare JSON
        ("pythonic", '[set_unit(unit="celsius")]'),
        ("mistral", '[TOOL_CALLS] [{"name": "set_unit", "arguments": {"unit": "celsius"}}]'),
    ],
)
def test_a_json_answer_beside_tools_is_told_from_a_call(family_model, fmt, call):
    """A response format beside tools (auto): the answer's JSON and the format's calls, each read as
    what it is (a call by its head, `{"name": "<tool>"` for JSON calls)."""
    answer = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    session = ConstrainedSession(family_model(fmt), tools=[UNIT], schema=answer)
    accepted, calls, labels = _forced(session, '{"ok":true}')
    assert accepted and calls == [] and set(labels) == {None}
    accepted, calls, _ = _forced(session, call)
    assert accepted and [c.name for c in calls] == ["set_unit"]
    assert not _forced(session, "Hi")[0]


HERMES_CALLS = (
    '<tool_call>\n{"name": "search", "arguments": {"query": "a"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "set_unit", "arguments": {"unit": "celsius"}}\n</tool_call>'
)


@pytest.mark.parametrize("fmt", [*FAMILIES, "hermes"])
@pytest.mark.parametrize("parallel", [True, False])
def test_calls_may_end_after_trailing_whitespace(fmt, parallel, family_model, tiny_model):
    """Whitespace after the last complete call may be followed by the end, in every format, under
    required with and without parallel calls (Qwen writes a newline after `</tool_call>`; a grammar
    that reads it as the start of another call forces the model into calls until max_tokens). The
    whitespace is markup, not a call's text."""
    model, text = (tiny_model, HERMES_CALLS) if fmt == "hermes" else (family_model(fmt), FAMILIES[fmt][2])
    session = ConstrainedSession(model, tools=[SEARCH, UNIT], tool_choice="required", parallel_tool_calls=parallel)
    assert session.tools.fmt == fmt
    if not parallel:
        text = _first_call(session, text)
    for tail in ("\n", "\n\n", " \n"):
        accepted, calls, labels = _forced(session, text + tail)
        assert accepted, (fmt, text + tail)
        assert len(calls) == (2 if parallel else 1)
        assert not any(label and label.startswith("call:") for label in labels[len(_ids(session, text)) :]), (
            fmt,
            labels,
        )


def _first_call(session, text: str) -> str:
    """One call out of the family's two: the longest prefix of `text` the one-call grammar takes (a
    token at a time, then a character at a time), then the tokens it forces (the closing markup)."""
    matcher, tokenize = session.compiled.matcher(), session.tokenizer_info.ll_tokenizer.tokenize_str
    ids = _ids(session, text)
    prefix = ids[: matcher.valid_prefix(ids)]
    for char in session.model.tokenizer.hf.decode(ids[len(prefix) :]):
        if matcher.valid_prefix(prefix + tokenize(char)) < len(prefix) + len(tokenize(char)):
            break
        prefix += tokenize(char)
    assert matcher.accept_tokens(prefix)
    return session.model.tokenizer.hf.decode(prefix + matcher.jump_forward_tokens()).rstrip()


EMPTY = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
NESTED = {
    "type": "function",
    "function": {
        "name": "plan",
        "parameters": {
            "type": "object",
            "properties": {"trip": {"type": "object", "properties": {"to": {"type": "string"}, "legs": {}}}},
        },
    },
}


def _py(value) -> str:
    """`value` as the pythonic formats write a Python literal."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(map(_py, value)) + "]"
    return repr(value) if value is None or isinstance(value, bool) else json.dumps(value, ensure_ascii=False)


def _raw(value) -> str:
    """A parameter value as the XML formats write it: strings raw, the rest JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _j(value) -> str:
    return json.dumps(value, ensure_ascii=False)


# format -> one call (name, arguments) written in the format's markup, as the model writes it
WRITE = {
    "hermes": lambda n, a: f'<tool_call>\n{{"name": {_j(n)}, "arguments": {_j(a)}}}\n</tool_call>',
    "mistral": lambda n, a: f'[TOOL_CALLS] [{{"name": {_j(n)}, "arguments": {_j(a)}}}]',
    "mistral_names": lambda n, a: f"[TOOL_CALLS]{n}[ARGS]{_j(a)}",
    "phi4": lambda n, a: f'<|tool_call|>[{{"name": {_j(n)}, "arguments": {_j(a)}}}]<|/tool_call|>',
    "llama3": lambda n, a: f'<|python_tag|>{{"name": {_j(n)}, "parameters": {_j(a)}}}',
    "pythonic": lambda n, a: f"[{n}({', '.join(f'{k}={_py(v)}' for k, v in a.items())})]",
    "lfm2": lambda n, a: f"<|tool_call_start|>{WRITE['pythonic'](n, a)}<|tool_call_end|>",
    "qwen3_coder": lambda n, a: (
        f"<tool_call>\n<function={n}>\n"
        + "".join(f"<parameter={k}>\n{_raw(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>"
    ),
    "glm45": lambda n, a: (
        f"<tool_call>{n}\n"
        + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_raw(v)}</arg_value>\n" for k, v in a.items())
        + "</tool_call>"
    ),
    "kimi_k2": lambda n, a: (
        "<|tool_calls_section_begin|><|tool_call_begin|>"
        f"functions.{n}:0<|tool_call_argument_begin|>{_j(a)}<|tool_call_end|><|tool_calls_section_end|>"
    ),
}


def _shapes(fmt: str) -> list[tuple[dict, dict]]:
    """(tool, arguments) of every shape: no parameters, nesting with non-ASCII text, and strings
    holding the format's own markup (its two-call example's first query, and the Hermes markup)."""
    markup = FIRST_QUERY.get(fmt, "a}]\n```")
    return [
        (EMPTY, {}),
        (NESTED, {"trip": {"to": "Zürich 東京 🚀", "legs": [1, {"a": []}]}}),
        (NESTED, {"trip": {"to": 'x"}}]\n</tool_call \n<tool_call', "legs": None}}),
        (SEARCH, {"query": markup}),
    ]


def _streamed(session, ids: list[int]) -> list[tuple[str | None, str]]:
    """The labelled text a generation of `ids` streams (`Delta.parts`): the tracker's labels over the
    streaming detokenizer's segments, which hold back a character cut between tokens."""
    _, labels = track(session, ids)
    detok, parts = session.model.tokenizer.detokenizer(), []
    for token, label in zip(ids, labels, strict=False):
        detok.add_token(token)
        parts.append((label, detok.last_segment))
    detok.finalize()
    return parts + [(labels[-1], detok.last_segment)]


@pytest.mark.parametrize("fmt", [*FAMILIES, "hermes"])
def test_streamed_arguments_are_exactly_the_final_arguments(fmt, family_model, tiny_model):
    """In every format and for every shape of arguments, the streamed argument fragments of a call join
    to exactly its final arguments, which parse to what was written: nothing of the format's closing
    markup is streamed as arguments (a tool without parameters leaked `}\\n</tool_call>`)."""
    model = tiny_model if fmt == "hermes" else family_model(fmt)
    for tool, args in _shapes(fmt):
        session = ConstrainedSession(model, tools=[tool], tool_choice="required", parallel_tool_calls=False)
        assert session.tools.fmt == fmt
        name = tool["function"]["name"]
        for tail in ("", "\n"):
            ids = _ids(session, WRITE[fmt](name, args) + tail)
            matcher = session.compiled.matcher()
            assert matcher.accept_tokens(ids) and matcher.is_accepting(), (fmt, args, tail)
            calls, _ = track(session, ids)
            assert [(c.name, c.args) for c in calls] == [(name, args)], (fmt, tail)
            stream = CallStream(session.tools)
            events = stream.feed(_streamed(session, ids)) + stream.finish(calls)
            assert ("open", 0, name) in events and _fragments(events, 0) == calls[0].arguments, (fmt, args, tail)


def test_a_forced_call_ends_at_its_last_token(tiny_model):
    """A call the grammar forces whole (a tool without parameters) is reported by llguidance before
    its tokens come; it is a call only once its last byte is fed: cut before, it is no call."""
    session = ConstrainedSession(tiny_model, tools=[EMPTY], tool_choice="required")
    ids = _ids(session, WRITE["hermes"]("ping", {}))
    tracker = session.tracker()
    tracker.start = 0
    labels = tracker.feed(ids)
    assert tracker.result(len(ids) - 2)[0] == [] and [c.name for c in tracker.result(len(ids))[0]] == ["ping"]
    assert labels[0] == labels[-1] == "markup" and "call:0" in labels


def test_kimi_calls_keep_the_ids_the_model_wrote(family_model):
    """Kimi K2 writes each call's id (`functions.name:idx`) and its template renders the history's ids
    in that place: the calls carry the ids the model wrote."""
    session = ConstrainedSession(family_model("kimi_k2"), tools=[SEARCH, UNIT])
    accepted, calls, _ = _forced(session, FAMILIES["kimi_k2"][2])
    assert accepted and [c.id for c in calls] == ["functions.search:0", "functions.set_unit:1"]


@pytest.mark.parametrize("text", ["f(a=1), g(b=2)", "f(a) or g(b)", "[f(a=1)] + g(b=2)"])
def test_pythonic_text_that_is_not_one_call_reads_as_none(text):
    """The pythonic reader takes one whole call; text that parses to something else (two calls, an
    expression) is no call yet, never an exception in the streamer."""
    from guided.tools.syntax import read_pythonic

    assert read_pythonic(text, {}) is None
    assert read_pythonic('f(a=1, b="x")', {}) == ("f", {"a": 1, "b": "x"})
