"""The field policy (`coreai.server.policy`, docs/reference/field-policy.md) in every dialect, and
model aliases, on a real server (the tiny model) through the real `openai` and `anthropic` SDKs:
hints are accepted and named in `x-coreai-ignored`, hosted tools are left out and named (forced:
a 400), validity fields stay enforced, unknown fields stay refused; an alias reaches the served
model and the reply names the model asked for."""

from __future__ import annotations

import re
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from coreai.server import ServerConfig
from coreai.server.anthropic.request import HINTS as MESSAGES_HINTS
from coreai.server.background import serve_in_thread
from coreai.server.openai.request import HINTS as OPENAI_HINTS
from coreai.server.policy import IGNORED
from coreai.server.responses.request import HINTS as RESPONSES_HINTS

USER = [{"role": "user", "content": "Say something."}]
DOC = Path(__file__).resolve().parents[1] / "docs" / "reference" / "field-policy.md"


@pytest.fixture(scope="module")
def tiny(tiny_model):
    config = ServerConfig(model_name="tiny", max_tokens=8, temperature=0.0, aliases=("claude-*", "gpt-4o=tiny"))
    with serve_in_thread(tiny_model, config) as base:
        yield base


def ignored(response: httpx.Response) -> list[str]:
    value = response.headers.get(IGNORED)
    return value.split(", ") if value else []


def test_claude_codes_hints_are_accepted_and_named(tiny):
    """The fields Claude Code 2.1.332 sends beside its messages (captured from the CLI) are a 200."""
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": False,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332"},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]}
        ],
        "metadata": {"user_id": '{"device_id": "d", "session_id": "s"}'},
        "thinking": {"budget_tokens": 31999, "type": "enabled", "display": "updates"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "tools": [
            {"name": "Read", "input_schema": {"type": "object", "properties": {"p": {"type": "string"}}}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
    }
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
    }
    response = httpx.post(tiny + "/v1/messages?beta=true", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "claude-sonnet-4-5"  # the model asked for
    names = ignored(response)
    assert {"metadata", "context_management", "thinking.display", "system[].cache_control"} <= set(names)
    assert "messages[].content[].cache_control" in names and "tools[1] (web_search_20250305)" in names
    assert "anthropic-beta: claude-code-20250219" in names and "anthropic-beta: context-management-2025-06-27" in names
    assert not any("interleaved-thinking" in n for n in names)  # a feature this server has
    count = httpx.post(
        tiny + "/v1/messages/count_tokens",
        json={k: v for k, v in body.items() if k not in ("max_tokens", "stream", "metadata")},
        headers=headers,
    )
    assert count.status_code == 200 and count.json()["input_tokens"] > 0 and "context_management" in ignored(count)


def test_a_forced_hosted_tool_is_refused_and_unknown_fields_stay_refused(tiny):
    c = anthropic.Anthropic(base_url=tiny, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="server tool"):
        c.messages.create(
            model="tiny",
            max_tokens=5,
            messages=USER,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
            tool_choice={"type": "any"},
        )
    with pytest.raises(anthropic.BadRequestError, match="frobnicate"):
        c.messages.create(model="tiny", max_tokens=5, messages=USER, extra_body={"frobnicate": True})


def test_codexs_hints_and_hosted_tools_are_accepted_and_named(tiny):
    """The fields Codex CLI 0.171.0 sends (captured from the CLI) beside a function tool."""
    c = openai.OpenAI(base_url=tiny + "/v1", api_key="x", max_retries=0)
    raw = c.responses.with_raw_response.create(
        model="gpt-4o",
        input="Hi",
        tools=[
            {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}},
            {"type": "web_search", "external_web_access": False},
        ],
        reasoning={"summary": "auto"},
        store=False,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="k",
        extra_body={"client_metadata": {"session_id": "s"}},
    )
    response = raw.parse()
    assert response.status in ("completed", "incomplete") and response.model == "gpt-4o"  # 8 tokens at most
    names = raw.headers[IGNORED].split(", ")
    assert {"prompt_cache_key", "client_metadata", "reasoning.summary", "tools[1] (web_search)"} <= set(names)
    assert "include: reasoning.encrypted_content" not in names  # made: a capsule (tests/test_agent_codex.py)
    with pytest.raises(openai.BadRequestError, match="hosted tool"):
        c.responses.create(model="tiny", input="Hi", tools=[{"type": "web_search"}], tool_choice={"type": "web_search"})


def test_chat_hints_are_named_and_validity_fields_are_not_hints(tiny):
    c = openai.OpenAI(base_url=tiny + "/v1", api_key="x", max_retries=0)
    raw = c.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, max_tokens=3, metadata={"a": "b"}, service_tier="auto", prompt_cache_key="k"
    )
    assert raw.parse().choices[0].finish_reason in ("stop", "length")
    assert raw.headers[IGNORED].split(", ") == ["metadata", "service_tier", "prompt_cache_key"]
    plain = c.chat.completions.with_raw_response.create(model="tiny", messages=USER, max_tokens=3)
    assert IGNORED not in plain.headers  # nothing ignored, no header
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    strict = c.chat.completions.with_raw_response.create(
        model="tiny",
        messages=USER,
        max_tokens=8,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}},
    )
    assert "x-coreai-enforcement" in strict.headers and IGNORED not in strict.headers  # enforced, not a hint


def test_aliases_reach_the_served_model(tiny):
    c = openai.OpenAI(base_url=tiny + "/v1", api_key="x", max_retries=0)
    assert c.chat.completions.create(model="claude-haiku-4-5", messages=USER, max_tokens=2).model == "claude-haiku-4-5"
    assert [m.id for m in c.models.list().data] == ["tiny", "gpt-4o"]  # a glob names no one id
    assert c.models.retrieve("claude-opus-4-1").id == "claude-opus-4-1"
    a = anthropic.Anthropic(base_url=tiny, api_key="x", max_retries=0)
    assert [m.id for m in a.models.list().data] == ["tiny", "gpt-4o"]
    with pytest.raises(openai.NotFoundError, match="claude-"):
        c.chat.completions.create(model="llama-3", messages=USER, max_tokens=2)  # the 404 says the aliases
    assert httpx.get(tiny + "/health").json()["aliases"] == ["claude-*", "gpt-4o"]


def test_an_alias_to_another_model_is_refused_at_start(tiny_model):
    from coreai.server.state import ServerState
    from runtime.errors import ParameterError

    with pytest.raises(ParameterError, match="serves 'tiny'"):
        ServerState.build(tiny_model, ServerConfig(model_name="tiny", aliases=("gpt-4o=llama",)))


def test_every_hint_is_in_the_docs_table():
    """docs/reference/field-policy.md lists every hint of every dialect, and no hint it does not have."""
    text = DOC.read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \| hint", text, re.M))
    for dialect, hints in (("messages", MESSAGES_HINTS), ("chat", OPENAI_HINTS), ("responses", RESPONSES_HINTS)):
        missing = {h.path for h in hints} - documented
        assert not missing, (dialect, missing)
    assert documented <= {h.path for h in (*MESSAGES_HINTS, *OPENAI_HINTS, *RESPONSES_HINTS)}


def test_a_budget_above_the_servers_is_capped_and_named_in_every_dialect(tiny):
    """One rule for every dialect (the field table): a reply bound above the server's `--max-tokens`
    (8 here; agent CLIs send 32000) is cut to it and named in `x-coreai-ignored`, never a 400;
    one at the bound is not named. Through the real SDKs, whole and streamed."""
    named = "{} 32000 (capped to the server's 8)"
    oa = openai.OpenAI(base_url=tiny + "/v1", api_key="k")
    for field in ("max_tokens", "max_completion_tokens"):
        raw = oa.chat.completions.with_raw_response.create(model="tiny", messages=USER, **{field: 32000})
        assert named.format(field) in ignored(raw.http_response)
        assert raw.parse().usage.completion_tokens <= 8
    with oa.chat.completions.with_streaming_response.create(
        model="tiny", messages=USER, max_tokens=32000, stream=True
    ) as streamed:
        assert named.format("max_tokens") in ignored(streamed.http_response)
        assert "data: [DONE]" in streamed.read().decode()
    raw = oa.responses.with_raw_response.create(model="tiny", input="Say something.", max_output_tokens=32000)
    assert named.format("max_output_tokens") in ignored(raw.http_response)
    assert raw.parse().usage.output_tokens <= 8
    an = anthropic.Anthropic(base_url=tiny, api_key="k")
    # A timeout given: the SDK refuses a non-streaming 32000-token request without one (Claude Code streams).
    raw = an.messages.with_raw_response.create(model="tiny", max_tokens=32000, messages=USER, timeout=60)
    assert named.format("max_tokens") in ignored(raw.http_response)
    assert raw.parse().usage.output_tokens <= 8
    at_bound = an.messages.with_raw_response.create(model="tiny", max_tokens=8, messages=USER)
    assert not [name for name in ignored(at_bound.http_response) if "capped" in name]
