"""Reasoning-aware guided generation on a tiny random-weight Qwen3 (mlx-lm's qwen3 architecture)
with the tiny test tokenizer (tests/conftest.py) carrying Qwen3's `<think>` / `</think>` tokens and a
Qwen3 chat template."""

from __future__ import annotations

import json

import coreai  # noqa: F401 - loads the system BLAS before mlx.core

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from coreai import ConstrainedSession  # noqa: E402
from runtime import load_model  # noqa: E402
from runtime.reasoning import ReasoningMarkers, ReasoningSplitter, detect_markers, split_reasoning  # noqa: E402

# Qwen3's format; the generation prompt opens the block as Qwen3-Thinking-2507 and DeepSeek-R1 do, and
# closes an empty one when enable_thinking is false, as Qwen3's template does.
TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
    "required": ["ok", "n"],
}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, write_tiny_tokenizer, write_tiny_network):
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    write_tiny_tokenizer(folder, added=("<think>", "</think>"), chat_template=TEMPLATE)
    write_tiny_network(folder, "qwen3", head_dim=16)
    return load_model(folder)


MESSAGES = [{"role": "user", "content": "Is it ok? Answer as JSON."}]


def test_markers_detected_from_the_template(qwen3, tiny_model):
    assert qwen3.tokenizer.reasoning_markers == ReasoningMarkers("<think>", "</think>")
    assert tiny_model.tokenizer.reasoning_markers is None  # Qwen2.5's template does not think
    assert detect_markers({"default": "x <think> y </think>"}) is not None and detect_markers(None) is None


def test_the_default_model_does_not_think(qwen_model):
    assert qwen_model.tokenizer.reasoning_markers is None


def test_reasoning_then_a_valid_answer(qwen3):
    session = ConstrainedSession(qwen3, schema=SCHEMA, max_reasoning_tokens=12)
    result = session.generate(MESSAGES, max_tokens=60, temperature=1.0, seed=5)
    assert result.valid and result.value is not None and set(result.value) == {"ok", "n"}
    assert result.reasoning and "</think>" not in result.text and result.text.startswith("{")
    end = qwen3.tokenizer.hf.convert_tokens_to_ids("</think>")
    assert result.token_ids[11] != end and result.token_ids[12] == end  # forced right after 12 tokens
    # the budget forced the end marker (random weights never close it): 12 tokens and the marker
    assert result.outcome.reasoning_tokens == 13


@pytest.mark.parametrize("speculate", [False, True], ids=["plain", "drafted"])
def test_a_cut_inside_the_block_counts_the_delivered_reasoning_tokens(qwen3, speculate):
    """Issue 41: max_tokens ends the output inside the block (with drafts, which run past it): every
    delivered token is a reasoning token, and no other is counted."""
    session = ConstrainedSession(qwen3, schema=SCHEMA, max_reasoning_tokens=40)
    result = session.generate(MESSAGES, max_tokens=7, speculative=qwen3 if speculate else None)
    assert result.finish_reason == "length" and (result.drafted_tokens > 0) == speculate
    assert result.outcome.reasoning_tokens == result.usage.completion_tokens == len(result.token_ids) == 7


def test_no_eos_inside_the_block(qwen3):
    """EOS is masked while thinking: with EOS favoured by a huge bias the block still runs to its budget."""
    session = ConstrainedSession(qwen3, schema=SCHEMA, max_reasoning_tokens=6)
    ids = qwen3.prompt_ids(MESSAGES)
    strategy = session.strategy(reasoning=session.plan(ids))
    eos = sorted(qwen3.tokenizer.eos_ids)
    strategy.begin(ids)
    logits = mx.zeros((1, qwen3.vocab_size))
    logits[:, eos] = 1e4
    for _ in range(6):
        step = strategy.step(logits)
        assert not set(step.tokens) & set(eos)
    assert strategy.gate.phase == "answer"


def test_enable_thinking_false_gives_no_reasoning(qwen3):
    session = ConstrainedSession(qwen3, schema=SCHEMA)
    result = session.generate(MESSAGES, max_tokens=40, chat_template_kwargs={"enable_thinking": False})
    assert result.valid and result.reasoning is None and result.outcome.reasoning_tokens == 0


def test_a_model_may_open_the_block_itself(qwen3):
    """With a template that leaves it to the model (Qwen3's own), the first token may be <think> or the
    grammar's start; nothing else."""
    session = ConstrainedSession(qwen3, schema=SCHEMA)
    ids = qwen3.prompt_ids(MESSAGES)[:-2]  # drop "<think>\n": the model decides
    strategy = session.strategy(reasoning=session.plan(ids))
    strategy.begin(ids)
    assert strategy.gate.phase == "start"
    strategy.prepare()
    bits = np.unpackbits(np.array(session.bitmask.current[:1]).view(np.uint8), bitorder="little")
    allowed = set(np.nonzero(bits)[0].tolist())
    think = qwen3.tokenizer.hf.convert_tokens_to_ids("<think>")
    assert think in allowed and all(qwen3.tokenizer.decode([t]).startswith("{") for t in allowed - {think})


def test_streaming_split_equals_the_whole_split():
    markers = ReasoningMarkers("<think>", "</think>")
    text = '<think>\nfirst, the sum</thi is not the end\n</think>\n\n{"ok":true}'
    for opened, sample in ((False, text), (True, text[len("<think>") :])):
        whole = split_reasoning(sample, markers, opened)
        splitter = ReasoningSplitter(markers, opened)
        pieces = [splitter.feed(ch) for ch in sample] + [splitter.finish()]
        assert ("".join(r for r, _ in pieces), "".join(a for _, a in pieces)) == whole
        assert whole == ("\nfirst, the sum</thi is not the end\n", '{"ok":true}')
    assert split_reasoning('{"ok":true}', markers) == (None, '{"ok":true}')


# -- the server: message.reasoning_content / delta.reasoning_content ---------------------------------


@pytest.fixture(scope="module")
def server(qwen3):
    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    with serve_in_thread(qwen3, ServerConfig(model_name="qwen3", max_tokens=400, temperature=0.0)) as base:
        yield base


def _chat(base, **kw):
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(model="qwen3", messages=MESSAGES, **kw)


def test_server_constrained_answer_after_reasoning_streams_the_same_split(server, qwen3):
    end = qwen3.tokenizer.hf.convert_tokens_to_ids("</think>")
    body = dict(
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
        reasoning_effort="low",
        max_tokens=300,
        # Greedy, and the random network may not close the block itself: it reasons to the budget
        # whatever its weights, then the end marker is forced (no seed decides the test).
        logit_bias={str(end): -100},
        temperature=0.0,
    )
    reply = _chat(server, **body)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop"
    assert set(json.loads(message.content)) == {"ok", "n"} and "</think>" not in message.content
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and reply.usage.completion_tokens > 256  # "low": 256 reasoning tokens, then the answer
    chunks = list(_chat(server, stream=True, **body))
    streamed_reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (streamed_reasoning, streamed) == (reasoning, message.content)


def test_server_thinking_off_and_plain_generation(server):
    off = _chat(server, max_tokens=8, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.model_extra.get("reasoning_content") is None
    plain = _chat(server, max_tokens=8)  # free text, still inside the block at max_tokens
    message = plain.choices[0].message
    assert message.model_extra["reasoning_content"] and not message.content
    assert plain.choices[0].finish_reason == "length"


def test_markers_the_tokenizer_cannot_spell_are_not_detected(tiny_model):
    """A template naming <think> for a tokenizer without it as one token (Qwen2.5's): no reasoning
    phase, so guided generation works as for any model; markers given by hand are a clear error."""
    hf = tiny_model.tokenizer.hf
    assert detect_markers("... <think> ... </think> ...", hf) is None
    assert detect_markers("... <think> ... </think> ...") is not None  # the template alone names them
    with pytest.raises(ValueError, match="single tokens"):
        ConstrainedSession(tiny_model, schema=SCHEMA, reasoning_markers=("<think>", "</think>"))
