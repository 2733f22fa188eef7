"""Issue 24 (fail closed): padding ids in free decoding, empty or vacuous constraints, logprobs at a
stop string, and the smaller faults a new user met (non-UTF-8 bodies, `messages[].name`,
`result.parsed`). Real parts: the real Qwen tokenizer, a real server on loopback, the `openai` client."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from runtime import SamplingParams, load_model

USER = [{"role": "user", "content": "Say something."}]
PAD = [151665, 151700, 151935]  # llama.cpp's `[PAD<id>]` entries of the Qwen GGUF (the last 271 ids)


@pytest.fixture(scope="module")
def tiny(tiny_model):
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", max_tokens=64, temperature=0.0)) as base:
        yield base


def post(base: str, **body) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", json={"model": "tiny", "messages": USER, **body}, timeout=120)


# ---- item 7: ids that are no real token are never drawn -------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 2.0])
def test_free_decoding_never_draws_padding_ids(tiny_qwen_model, temperature):
    """logit_bias +100 on llama.cpp's padding entries would make them the argmax; the padding mask
    keeps them at -inf (the real Qwen tokenizer, whose GGUF lists them as tokens)."""
    model = tiny_qwen_model
    assert model.tokenizer.padding_ids(model.vocab_size) == frozenset(range(151665, 151936))
    bias = {i: 100 for i in PAD}
    result = model.generate(
        "Hello", max_tokens=8, sampling=SamplingParams(temperature=temperature, seed=3, logit_bias=bias)
    )
    assert len(result.token_ids) == 8 and not set(result.token_ids) & set(range(151665, 151936))


def test_ids_past_the_tokenizer_are_never_drawn(tiny_model_dir, write_tiny_network, tmp_path):
    """A logit width wider than the tokenizer (as many exported models have): the extra ids too."""
    for f in tiny_model_dir.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, tmp_path / f.name)
    real = load_model(tiny_model_dir).vocab_size
    write_tiny_network(tmp_path, "qwen2", vocab_size=real + 64)
    wide = load_model(tmp_path)
    padding = wide.tokenizer.padding_ids(wide.vocab_size)
    assert max(padding) == real + 63 and set(range(real, real + 64)) <= padding
    bias = {real: 100, real + 63: 100, min(padding): 100}
    for temperature in (0.0, 2.0):
        sampling = SamplingParams(temperature=temperature, seed=5, logit_bias=bias)
        result = wide.generate("Hello", max_tokens=6, sampling=sampling, logprobs=True)
        assert not set(result.token_ids) & padding, result.token_ids


def test_server_free_decoding_never_draws_padding_ids(tiny, tiny_model):
    padding = sorted(tiny_model.tokenizer.padding_ids(tiny_model.vocab_size))
    r = post(tiny, max_tokens=6, logit_bias={str(i): 100 for i in padding[:3]}, logprobs=True, top_logprobs=3)
    assert r.status_code == 200, r.text
    entries = r.json()["choices"][0]["logprobs"]["content"]
    tops = [t for c in entries for t in c["top_logprobs"]]
    assert tops and all(t["bytes"] for t in tops)  # a padding id has no text: none was offered or drawn


# ---- item 2: a requested constraint never comes out empty or vacuous in silence --------------------

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "fields, param, code",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
            "missing_required_parameter",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": None}}},
            "response_format.json_schema.schema",
            "missing_required_parameter",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "missing_required_parameter"),
        ({"structured_outputs": {}}, "structured_outputs", "invalid_value"),
        ({"structured_outputs": {"json": None}}, "structured_outputs", "invalid_value"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "invalid_grammar"),
        ({"structured_outputs": {"choice": [""]}}, "structured_outputs.choice", "invalid_grammar"),
        ({"structured_outputs": {"regex": ""}}, "structured_outputs.regex", "invalid_grammar"),
        ({"structured_outputs": {"grammar": ""}}, "structured_outputs.grammar", "invalid_grammar"),
        ({"structured_outputs": {"grammar": "  \n"}}, "structured_outputs.grammar", "invalid_grammar"),
        ({"structured_outputs": {"grammar": 'start: ""'}}, "structured_outputs.grammar", "invalid_grammar"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice", "invalid_value"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tool_choice",
            "invalid_value",
        ),
    ],
)
def test_empty_constraints_are_400(tiny, fields, param, code):
    r = post(tiny, max_tokens=4, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error


@pytest.mark.parametrize("schema", [True, {}, {"title": "anything", "description": "no keyword asserts"}])
@pytest.mark.parametrize("where", ["response_format", "structured_outputs"])
def test_a_schema_that_asserts_nothing_is_reported(tiny, schema, where):
    """`true`, `{}` (any JSON value) are legitimate requests, answered, and said to be that."""
    if where == "response_format":
        fields = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    else:
        fields = {"structured_outputs": {"json": schema}}
    r = post(tiny, max_tokens=4, **fields)
    assert r.status_code == 200, r.text
    assert r.headers["x-coreai-enforcement"] == "grammar (any JSON value: the schema asserts nothing)"
    typed = post(tiny, max_tokens=4, structured_outputs={"json": {"type": "string"}})
    assert typed.headers["x-coreai-enforcement"] == "grammar"


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(choices=[]), "non-empty"),
        (dict(choices=[""]), "only the empty output"),
        (dict(regex=""), "only the empty output"),
        (dict(regex="^$"), "only the empty output"),
        (dict(grammar=""), "the grammar is empty"),
        (dict(grammar="\n  \n"), "the grammar is empty"),
        (dict(grammar='start: ""'), "only the empty output"),
        (dict(grammar="root ::= "), "only the empty output"),
        (dict(schema=None), "give exactly one"),
    ],
)
def test_python_api_refuses_empty_constraints(tiny_model, options, words):
    from coreai import ConstrainedSession
    from guided import GrammarError

    with pytest.raises((GrammarError, ValueError), match=words):
        ConstrainedSession(tiny_model, **options)
    assert ConstrainedSession(tiny_model, choices=["", "yes"]).generate("x", max_tokens=3).valid  # "" among others


# ---- item 9 (parts) -------------------------------------------------------------------------------


def test_a_body_that_is_not_utf8_has_a_code(tiny):
    body = '{"model": "tiny", "messages": [{"role": "user", "content": "caf\u00e9"}]}'.encode("latin-1")
    r = httpx.post(tiny + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_json" and "UTF-8" in r.json()["error"]["message"]


def test_message_names_are_accepted(tiny, tiny_model):
    """OpenAI's optional `name` of system, user and assistant messages: passed to the template."""
    messages = [
        {"role": "system", "content": "Be brief.", "name": "rules"},
        {"role": "user", "content": "Hi", "name": "bob"},
        {"role": "assistant", "content": "Hello", "name": "helper"},
        {"role": "user", "content": "Again", "name": "bob"},
    ]
    r = post(tiny, max_tokens=2, messages=messages)
    assert r.status_code == 200, r.text
    r = httpx.post(
        tiny + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "tool", "content": "x", "tool_call_id": "1", "name": "f"}]},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].name"  # not a field of tool messages


def test_a_pydantic_schema_gives_an_instance(tiny_model):
    """`result.parsed` is an instance of the class given as the schema (as the openai client's)."""
    import pydantic

    from coreai import ConstrainedSession

    class Pick(pydantic.BaseModel):
        answer: bool

    # compact: in 12 tokens the random tiny model could not finish under a layout with whitespace
    result = ConstrainedSession(tiny_model, schema=Pick, whitespace="compact").generate("x", max_tokens=12)
    assert result.valid and isinstance(result.parsed, Pick) and result.parsed.answer == result.value["answer"]
    cut = ConstrainedSession(tiny_model, schema=Pick).generate("x", max_tokens=2)
    assert not cut.valid and cut.parsed is None
    assert ConstrainedSession(tiny_model, schema={"type": "boolean"}).generate("x", max_tokens=3).parsed is None


# ---- item 5 on the real model: the request, whole and streamed ------------------------------


@pytest.mark.model
def test_qwen_logprobs_end_with_the_content_at_a_stop_string(qwen_model):
    body = {
        "model": "qwen",
        "messages": [{"role": "user", "content": "Count from 1 to 9 separated by spaces."}],
        "max_tokens": 16,
        "temperature": 0,
        "stop": [" 5"],
        "logprobs": True,
    }
    with serve_in_thread(qwen_model, ServerConfig(model_name="qwen", max_tokens=64, temperature=0.0)) as base:
        whole = httpx.post(base + "/v1/chat/completions", json=body, timeout=300).json()["choices"][0]
        with httpx.stream("POST", base + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
            events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert whole["message"]["content"] == "1 2 3 4"
    tokens = [t["token"] for t in whole["logprobs"]["content"]]
    assert "".join(tokens) == "1 2 3 4", tokens
    streamed = [
        t["token"] for e in events for c in e["choices"] for t in ((c.get("logprobs") or {}).get("content") or [])
    ]
    assert streamed == tokens


def test_an_assistant_message_without_content_or_calls_is_a_400_naming_its_content(tiny):
    """OpenAI: an assistant message's content is required unless it has tool_calls."""
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "?"},
    ]
    r = post(tiny, max_tokens=2, messages=messages)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[1].content", r.text
    assert "tool_calls" in r.json()["error"]["message"]
