"""`guided.schema_prompt`: the schema said in words for the prompt (issue 27)."""

import copy

import pytest

from coreai import ConstrainedSession
from guided.prompt import describe_in_prompt
from guided.schema_prompt import LEFT_TO_GRAMMAR, SCHEMA_PROMPT_STYLE, describe_schema, with_schema_description
from runtime.errors import ParameterError

INVOICE = {
    "type": "object",
    "properties": {
        "vendor": {"type": "string", "description": "the company that issued\n the invoice"},
        "invoice_date": {"type": "string", "format": "date"},
        "currency": {"enum": ["EUR", "USD"]},
        "total": {"type": "number", "minimum": 0},
        "paid": {"type": "boolean"},
    },
    "required": ["vendor", "invoice_date", "currency", "total"],
}


def test_object_properties_in_order_with_formats_enums_ranges_and_optional_marks():
    assert describe_schema(INVOICE, "schema") == "\n".join(
        [
            "Respond with only a JSON object with these keys, in this order:",
            '- "vendor" (string): the company that issued the invoice',
            '- "invoice_date" (string, a date written YYYY-MM-DD)',
            '- "currency" (one of "EUR", "USD")',
            '- "total" (number, >= 0)',
            '- "paid" (boolean, optional)',
        ]
    )


def test_nested_objects_and_arrays_of_objects_are_indented():
    schema = {
        "type": "object",
        "properties": {
            "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"qty": {"type": "integer", "minimum": 1, "maximum": 9}}},
                "minItems": 1,
            },
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3, "uniqueItems": True},
        },
        "required": ["address", "items", "tags"],
    }
    assert describe_schema(schema, "schema").splitlines()[1:] == [
        '- "address" (object):',
        '  - "city" (string)',
        '- "items" (array of objects with these keys, at least 1 item):',
        '  - "qty" (integer, from 1 to 9, optional)',
        '- "tags" (array of strings (at most 20 characters), at most 3 items, no duplicates)',
    ]


@pytest.mark.parametrize(
    "schema, expected",
    [
        ({"type": "string", "format": "date-time"}, "a JSON string, a date and time written YYYY-MM-DDTHH:MM:SS"),
        ({"type": "string", "format": "uuid"}, "a JSON string, a UUID"),
        ({"type": "string", "format": "x-custom"}, "a JSON string, format x-custom"),
        ({"type": "string", "pattern": "^[A-Z]{3}$"}, "a JSON string, matching the regular expression ^[A-Z]{3}$"),
        ({"const": "yes"}, 'a JSON value: exactly "yes"'),
        ({"enum": [1, None, "a"]}, 'a JSON value: one of 1, null, "a"'),
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "a JSON string or null"),
        ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "a JSON value: one of: integer | string"),
        ({"type": ["integer", "null"], "exclusiveMinimum": 0}, "a JSON integer or null, > 0"),
        ({"type": "number", "multipleOf": 0.01}, "a JSON number, a multiple of 0.01"),
        ({"type": "string", "examples": ["INV-1"]}, 'a JSON string, e.g. "INV-1"'),
        ({"minimum": 2}, "a JSON number, >= 2"),  # the type implied by its keywords
        (True, "a JSON value."),
        ({}, "a JSON value."),
    ],
)
def test_single_values(schema, expected):
    assert describe_schema(schema, "schema").startswith(f"Respond with only {expected}")


def test_local_refs_are_followed_and_recursion_is_named_not_expanded():
    schema = {
        "$defs": {
            "node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}, "n": {"type": "integer"}}}
        },
        "$ref": "#/$defs/node",
    }
    assert describe_schema(schema, "schema").splitlines()[1:] == [
        '- "child" (a value like node, optional)',
        '- "n" (integer, optional)',
    ]
    root = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    lines = describe_schema(root, "schema").splitlines()
    assert lines[1] == '- "next" (object, optional):'
    assert lines[2] == '  - "next" (a value like the top-level value, optional)'


def test_deep_nesting_is_bounded():
    schema: dict = {"type": "string"}
    for _ in range(50):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    assert len(describe_schema(schema, "schema").splitlines()) < 12


def test_root_description_follows_the_lead_line():
    schema = {"type": "object", "description": "An invoice.", "properties": {"n": {"type": "string"}}}
    assert describe_schema(schema, "schema").splitlines()[:2] == [
        "Respond with only a JSON object with these keys, in this order:",
        "An invoice.",
    ]


def test_description_goes_first_in_an_existing_system_message():
    messages = [{"role": "system", "content": "You extract fields."}, {"role": "user", "content": "Doc"}]
    before = copy.deepcopy(messages)
    out = with_schema_description(messages, INVOICE)
    assert messages == before  # not changed in place
    assert out[0] == {"role": "system", "content": describe_schema(INVOICE) + "\n\nYou extract fields."}
    assert out[1:] == messages[1:]


def test_a_system_message_is_added_for_text_and_for_messages_without_one():
    assert with_schema_description("Doc", INVOICE) == [
        {"role": "system", "content": describe_schema(INVOICE)},
        {"role": "user", "content": "Doc"},
    ]
    user = [{"role": "user", "content": "Doc"}]
    assert with_schema_description(user, INVOICE) == [{"role": "system", "content": describe_schema(INVOICE)}, *user]


def test_hints_name_only_the_keys_whose_form_the_grammar_fixes():
    assert describe_schema(INVOICE, "hints") == "\n".join(
        [
            "Write these values in this form:",
            '- "invoice_date" (string, a date written YYYY-MM-DD)',
            '- "currency" (one of "EUR", "USD")',
            '- "total" (number, >= 0)',
        ]
    )
    nested = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "address": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
            "notes": {"type": "object", "properties": {"text": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}},
            "when": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
        },
    }
    assert describe_schema(nested, "hints").splitlines()[1:] == [
        '- "address" (object, optional):',
        '  - "zip" (string, matching the regular expression ^[0-9]{5}$, optional)',
        '- "tags" (array of strings (at most 20 characters), optional)',
        '- "when" (string, a date written YYYY-MM-DD, or null, optional)',
    ]
    assert describe_schema({"type": "string", "format": "date"}, "hints") == (
        "Respond with only a JSON string, a date written YYYY-MM-DD."
    )


def test_hints_without_any_form_keyword_add_nothing_to_the_prompt():
    plain = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}}
    assert describe_schema(plain, "hints") == describe_schema({"type": "string"}, "hints") == ""
    chat = [{"role": "system", "content": "You extract fields."}, {"role": "user", "content": "Doc"}]
    assert with_schema_description(chat, plain, "hints") == chat
    assert with_schema_description("Doc", plain, "hints") == [{"role": "user", "content": "Doc"}]


def test_an_unknown_style_is_refused():
    with pytest.raises(ValueError, match="style must be one of schema, hints, got 'short'"):
        describe_schema(INVOICE, "short")
    assert describe_schema(INVOICE, None) == describe_schema(INVOICE, SCHEMA_PROMPT_STYLE)


def test_token_ids_cannot_carry_a_description():
    with pytest.raises(ValueError, match="token ids"):
        with_schema_description([1, 2, 3], INVOICE)


# -- ConstrainedSession(schema_in_prompt=...) on a tiny random network with the real Qwen tokenizer -----


def test_session_puts_the_description_in_the_prompt_it_sends(tiny_model):

    chat = [{"role": "system", "content": "You extract fields."}, {"role": "user", "content": "Doc"}]
    on = ConstrainedSession(tiny_model, schema=INVOICE, schema_in_prompt=True)
    off = ConstrainedSession(tiny_model, schema=INVOICE, schema_in_prompt=False)
    assert on.prompt(chat) == with_schema_description(chat, INVOICE)
    assert off.prompt(chat) == chat
    assert on.prompt("Doc") == with_schema_description("Doc", INVOICE)
    assert on.prompt("Doc", chat_template=False) == describe_schema(INVOICE) + "\n\nDoc"
    assert on.prompt([1, 2, 3]) == [1, 2, 3]  # token ids: the caller rendered the prompt
    result = on.generate(chat, max_tokens=4)
    assert result.usage.prompt_tokens == len(tiny_model.prompt_ids(with_schema_description(chat, INVOICE)))
    assert off.generate(chat, max_tokens=4).usage.prompt_tokens == len(tiny_model.prompt_ids(chat))


def test_json_object_gets_no_hints_and_other_constraints_refuse_the_option(tiny_model):

    # The shipped style ("hints") says only what the grammar fixes and a model could not guess: for
    # json_object nothing, so the prompt is sent as the user's message alone.
    session = ConstrainedSession(tiny_model, json_object=True, schema_in_prompt=True)
    assert session.prompt("Doc") == [{"role": "user", "content": "Doc"}]
    assert describe_schema(session.json_spec.schema, "schema") == "Respond with only a JSON object."
    with pytest.raises(ValueError, match="schema_in_prompt needs a JSON Schema"):
        ConstrainedSession(tiny_model, regex="[0-9]+", schema_in_prompt=True)
    assert ConstrainedSession(tiny_model, regex="[0-9]+").prompt("Doc") == "Doc"  # the default leaves it alone


def test_cli_flag_reaches_the_prompt(tiny_model, tiny_model_dir, capsys):
    from coreai.cli import build_parser, main
    from coreai.commands.generate import request_of
    from coreai.service import prepare

    def prompt_ids(*flags):
        args = build_parser().parse_args(["generate", str(tiny_model_dir), "--prompt", "x", *flags])
        return prepare(tiny_model, request_of(args, args.prompt, None)).prompt_ids

    schema = '{"type": "object", "properties": {"day": {"type": "string", "format": "date"}}, "required": ["day"]}'
    described, plain = (
        prompt_ids("--schema", schema, "--schema-in-prompt"),
        prompt_ids("--schema", schema, "--no-schema-in-prompt"),
    )
    assert len(described) > len(plain)
    assert "YYYY-MM-DD" in tiny_model.tokenizer.decode(described) and "YYYY" not in tiny_model.tokenizer.decode(plain)
    assert main(["generate", str(tiny_model_dir), "--prompt", "x", "--regex", "[0-9]", "--schema-in-prompt"]) == 1
    assert "--schema-in-prompt needs --schema or --json-object" in capsys.readouterr().err


def test_server_request_field_and_server_setting(tiny_model):
    import openai

    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    chat = [{"role": "user", "content": "Doc"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "invoice", "schema": INVOICE}}
    described = len(tiny_model.prompt_ids(with_schema_description(chat, INVOICE)))
    plain = len(tiny_model.prompt_ids(chat))

    def prompt_tokens(client, **extra):
        reply = client.chat.completions.create(
            model="tiny", messages=chat, response_format=fmt, max_tokens=2, extra_body=extra
        )
        return reply.usage.prompt_tokens

    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", temperature=0.0, schema_in_prompt=True)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        assert prompt_tokens(client) == described  # the server's --schema-in-prompt
        assert prompt_tokens(client, schema_in_prompt=False) == plain  # the request overrides it
        with pytest.raises(openai.BadRequestError, match="schema_in_prompt needs a JSON answer format"):
            client.chat.completions.create(
                model="tiny", messages=chat, max_tokens=2, extra_body={"schema_in_prompt": True}
            )
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", temperature=0.0, schema_in_prompt=False)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        assert prompt_tokens(client) == plain
        assert prompt_tokens(client, schema_in_prompt=True) == described


@pytest.mark.parametrize("tools", [False, True])
def test_the_session_and_the_server_render_one_prompt(tiny_model, tools, monkeypatch):
    """One pipeline (`guided.prompt`): the session and the server's chat front end render the same
    token ids for the same request, also when the first message has the `developer` role (the
    session used to put the tool prompt before it as a second system message)."""
    from coreai import ConstrainedSession
    from coreai.server.config import ServerConfig
    from coreai.server.openai.request import chat_request
    from coreai.server.openai.schemas import ChatCompletionRequest
    from coreai.service import Service
    from guided import GrammarCache
    from tests.tool_defs import SEARCH

    messages = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Doc"}]
    body = {"model": "tiny", "messages": messages, "response_format": {"type": "json_object"}}
    options = {"json_object": True}
    if tools:
        body |= {"tools": [SEARCH]}
        options |= {"tools": [SEARCH]}
    service = Service(tiny_model, ServerConfig().settings(), GrammarCache())
    params = service.prepare(chat_request(ChatCompletionRequest(**body)))
    rendered = []  # what the session renders, observed at the model's own call
    render = tiny_model.prompt_ids
    monkeypatch.setattr(tiny_model, "prompt_ids", lambda *a, **k: rendered.append(render(*a, **k)) or rendered[-1])
    ConstrainedSession(tiny_model, **options).generate(messages, max_tokens=1)
    assert rendered[0] == params.prompt_ids  # (the loop passes the ids through it again)
    text = tiny_model.tokenizer.hf.decode(params.prompt_ids)
    assert text.count("<|im_start|>system") == 1 and "developer" not in text and "Be terse." in text


CODES = [f"SKU-{i:05d}" for i in range(3000)]
PRODUCT = {
    "type": "object",
    "properties": {
        "product": {"enum": CODES},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "day": {"type": "string", "format": "date"},
    },
    "required": ["product", "currency", "day"],
}


def test_hints_of_a_huge_enum_stay_within_the_budget(tiny_model):
    """A 3,000-value enum is said by its size and a few members, so the description stays within the
    token budget; the small enum and the date keep their full hints. The grammar still holds all
    3,000 codes."""
    session = ConstrainedSession(tiny_model, schema=PRODUCT, schema_hint_budget=300)
    count = lambda text: len(tiny_model.tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    hints = session.prompt("Which product?")[0]["content"]
    assert count(hints) <= 300
    assert '"product" (one of 3000 values, such as "SKU-00000"' in hints
    assert '"currency" (one of "EUR", "USD", "GBP")' in hints and "YYYY-MM-DD" in hints
    full = describe_schema(PRODUCT)
    assert count(full) > 20 * count(hints) and "SKU-02999" in full
    ids = lambda budget: session.model.prompt_ids(  # noqa: E731
        describe_in_prompt(session, "Which product?", budget=budget)
    )
    without = session.model.prompt_ids(describe_in_prompt(session, "Which product?", schema_in_prompt=False))
    assert len(ids(300)) - len(without) <= 300 < len(ids(10**6)) - len(without)
    assert session.matcher.accept_tokens(
        tiny_model.tokenizer.encode('{"product": "SKU-02999"', add_special_tokens=False)
    )


def test_past_the_budget_the_last_keys_are_left_to_the_grammar():
    """Many keys with hints: the lines that do not fit are left out with a note that says how many;
    within the budget the description is exactly the full one."""
    schema = {"type": "object", "properties": {f"d{i}": {"type": "string", "format": "date"} for i in range(40)}}
    words = lambda text: len(text.split())  # noqa: E731 - any count works: the budget is in its units
    full = describe_schema(schema)
    assert describe_schema(schema, budget=words(full), count=words) == full
    cut = describe_schema(schema, budget=60, count=words)
    assert words(cut) <= 60 and cut.startswith(full.split("\n")[0])
    kept = cut.split("\n")[1:-1]
    assert kept == full.split("\n")[1 : 1 + len(kept)] and LEFT_TO_GRAMMAR.format(40 - len(kept)) == cut.split("\n")[-1]


def test_a_bad_budget_is_refused(tiny_model):
    with pytest.raises(ParameterError, match="schema_hint_budget"):
        ConstrainedSession(tiny_model, schema=PRODUCT, schema_hint_budget=0)


def test_server_hint_budget_setting_and_request_field(tiny_model):
    """The hint budget per server (`--schema-hint-budget`) and per request (`schema_hint_budget`):
    a 3,000-value enum adds at most the budget; a request may widen it; 0 is a 400 naming the field."""
    import openai

    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    chat = [{"role": "user", "content": "Which product?"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PRODUCT}}
    plain = len(tiny_model.prompt_ids(chat))

    def added(client, **extra):
        reply = client.chat.completions.create(
            model="tiny", messages=chat, response_format=fmt, max_tokens=1, extra_body=extra
        )
        return reply.usage.prompt_tokens - plain

    config = ServerConfig(model_name="tiny", temperature=0.0, schema_hint_budget=300)
    with serve_in_thread(tiny_model, config) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        assert 0 < added(client) <= 300 + 8  # the description, and the system message's own tokens
        with pytest.raises(openai.BadRequestError, match="the prompt has 3[0-9]{4} tokens"):  # every value said
            added(client, schema_hint_budget=10**6)
        with pytest.raises(openai.BadRequestError, match="schema_hint_budget"):
            added(client, schema_hint_budget=0)
