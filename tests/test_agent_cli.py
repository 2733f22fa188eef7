"""Claude Code (the real CLI, node_modules/.bin/claude, pinned in package.json) against a real
`coreai serve` on loopback (`tests/agent_cli.py` runs it):

- fast lane: one turn of the CLI's full default set-up (system prompt, a dozen tools, deferred tools,
  thinking) on a tiny random model with a long context; and the recorded session
  (tests/data/claude_code/session.json, re-captured by tests/capture_claude_code.py) replayed
  request by request against it, each reply parsed with the `anthropic` SDK's types;
- model lane: the default model, at temperature 0, in a workspace holding hello.py, asked what it
  prints, with the CLI's own `--system-prompt` and `--tools Read` (the full default prompt takes
  minutes to prefill on a CPU): the CLI executes a call the model made and the turn ends with no
  API error.

A missing CLI is a failure, never a skip: `make install` (and CI's `.ci/run`) installs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pydantic
import pytest
from agent_cli import CLAUDE, MISSING, Recorder, fresh_workspace, run_claude

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread

SESSION = Path(__file__).parent / "data" / "claude_code" / "session.json"
EVENTS = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
HELLO = 'print("Hello, world!")\n'


@pytest.fixture(scope="module")
def claude() -> Path:
    if not CLAUDE.exists():
        pytest.fail(MISSING, pytrace=False)
    return CLAUDE


@pytest.fixture(scope="module")
def tiny_long(tmp_path_factory, write_tiny_tokenizer, write_tiny_network):
    """A tiny random qwen2 network (one layer, two heads: a cold prefill of Claude Code's prompt,
    about 37,000 tokens of the tiny tokenizer, takes seconds) with a context long enough for it,
    which ends its turns. Greedy, its answers begin " Ideacheckright..." whatever the prompt; its
    end token's row of the output head is made that "right"'s, a little larger, so it ends there.
    (A turn the budget cuts is no completed turn: the CLI asks to resume three times, then fails.)"""
    import mlx.core as mx
    from tokenizers import Tokenizer

    from runtime import load_model

    folder = tmp_path_factory.mktemp("tiny-long")
    write_tiny_tokenizer(folder)
    shape = dict(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    write_tiny_network(folder, "qwen2", max_position_embeddings=131072, **shape)
    weights = mx.load(str(folder / "model.safetensors"))
    vocabulary = Tokenizer.from_file(str(folder / "tokenizer.json"))
    head = weights["lm_head.weight"]
    head[vocabulary.token_to_id("<|im_end|>")] = head[vocabulary.token_to_id("right")] * 1.05
    mx.save_safetensors(str(folder / "model.safetensors"), {**weights, "lm_head.weight": head})
    return load_model(folder)


@pytest.fixture(scope="module")
def tiny_server(tiny_long):
    config = ServerConfig(model_name="tiny", aliases=("claude-*",), max_tokens=24, temperature=0.0)
    with serve_in_thread(tiny_long, config) as base:
        yield base


def _no_api_error(run) -> None:
    assert run.result, run.describe()
    assert run.result.get("api_error_status") is None, run.describe()
    assert "API Error" not in str(run.result.get("result")), run.describe()


def test_a_claude_code_turn_on_the_tiny_model(claude, tiny_server, tmp_path):
    recorder = Recorder(upstream=tiny_server)
    with recorder.serving() as base:
        run = run_claude(base, fresh_workspace(tmp_path, {}), "Say hi.", "--max-turns", "2", essential_only=False)
    assert run.returncode == 0 and run.result["is_error"] is False and run.result["result"], run.describe()
    _no_api_error(run)
    sent = [(x.method, x.path, x.status) for x in recorder.exchanges]
    assert ("HEAD", "/api/hello", 200) in sent  # the start-up probe
    messages = [x for x in recorder.exchanges if x.path.startswith("/v1/messages")]
    assert messages and all(x.path == "/v1/messages?beta=true" and x.status == 200 for x in messages), sent
    first = messages[0].body
    assert first["stream"] and any(t.get("defer_loading") for t in first["tools"])  # the real first request


def _replies(client: anthropic.Anthropic, request: dict) -> list:
    """The recorded `request` sent again, its reply parsed with the SDK's types (stream events, a
    message or a token count)."""
    headers = {"anthropic-beta": request["headers"].get("anthropic-beta", "")}
    body = request["body"]
    if "count_tokens" in request["path"]:
        reply = client.post(request["path"], body=body, cast_to=object, options={"headers": headers})
        return [anthropic.types.MessageTokensCount.model_validate(reply)]
    if not body.get("stream"):
        reply = client.post(request["path"], body=body, cast_to=object, options={"headers": headers})
        return [anthropic.types.Message.model_validate(reply)]
    stream = client.post(
        request["path"],
        body=body,
        cast_to=object,
        options={"headers": headers},
        stream=True,
        stream_cls=anthropic.Stream[anthropic.types.RawMessageStreamEvent],
    )
    return [EVENTS.validate_python(event.model_dump()) for event in stream]  # the SDK's parse, then validated


def test_the_recorded_session_replays_on_the_tiny_model(tiny_server):
    recorded = json.loads(SESSION.read_text())
    client = anthropic.Anthropic(base_url=tiny_server, api_key="unused", max_retries=0)
    posts = [r for r in recorded["requests"] if r["method"] == "POST"]
    assert len(posts) >= 4 and any(r["method"] == "HEAD" for r in recorded["requests"])
    references = 0
    for request in posts:
        events = _replies(client, request)
        kinds = [e.type for e in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
        assert events[-2].delta.stop_reason in ("end_turn", "max_tokens", "tool_use"), events[-2]
        blocks = [e.content_block for e in events if e.type == "content_block_start"]
        assert all(b.type in ("text", "thinking", "tool_use") for b in blocks)
        for message in request["body"]["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                references += block.get("type") == "tool_result" and "tool_reference" in json.dumps(block)
    assert references  # the session loads a deferred tool through ToolSearch's tool_reference
    counted = client.post(
        "/v1/messages/count_tokens?beta=true",
        body={k: v for k, v in posts[-1]["body"].items() if k not in ("max_tokens", "stream", "metadata")},
        cast_to=object,
    )
    assert anthropic.types.MessageTokensCount.model_validate(counted).input_tokens > 10_000


def test_claude_code_reads_hello_py_on_the_real_model(claude, qwen_model, tmp_path):
    config = ServerConfig(model_name="qwen", aliases=("claude-*",), max_tokens=256, temperature=0.0)
    workspace = fresh_workspace(tmp_path, {"hello.py": HELLO})
    # Qwen's own system line, then the tool, as the Codex test says it. The prompt holds pytest's
    # numbered tmp path, so at temperature 0 the reply still varies from run to run: "a coding
    # assistant in DIR. Read files with the Read tool, then answer" let the model guess the answer
    # (8 tokens, no call) in 4 runs of 4 on 2026-12-06; this line made the call in 5 of 5.
    system = (
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant. You cannot see files: read "
        f"them with the Read tool before answering. The working directory is {workspace}."
    )
    with serve_in_thread(qwen_model, config) as base:
        run = run_claude(
            base,
            workspace,
            "What does hello.py print?",
            "--system-prompt",
            system,
            "--tools",
            "Read",
            "--max-turns",
            "3",
        )
    calls = run.blocks("assistant", "tool_use")
    results = run.blocks("user", "tool_result")
    assert calls and results, run.describe()  # the CLI executed a call the model made
    assert {r["tool_use_id"] for r in results} <= {c["id"] for c in calls}
    _no_api_error(run)
