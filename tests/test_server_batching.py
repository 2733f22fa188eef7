"""Continuous batching and the prefix cache through a real loopback server, the official `openai`
client and the real Qwen model (short outputs: tens of tokens)."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
COLORS = {
    "type": "object",
    "properties": {"colors": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["colors"],
    "additionalProperties": False,
}
CITY = r"[A-Z][a-z]+, [A-Z][a-z]+"


def ask(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def schema_format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


REQUESTS = [  # (messages, extra create() arguments)
    (ask("Invent a person with a name and an age, as JSON."), dict(response_format=schema_format("person", PERSON))),
    (ask("List three colors of the rainbow as JSON."), dict(response_format=schema_format("colors", COLORS))),
    (ask("Name a European city and its country."), dict(extra_body={"structured_outputs": {"regex": CITY}})),
    (ask("What is the capital of France? One sentence."), {}),
    (ask("Write a Python one-liner that reverses a string s."), {}),
    (ask("Count from one to ten in words."), dict(stop=["Four"])),
]


def create(base: str, messages, extra: dict, max_tokens: int = 24):
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    return client.chat.completions.create(
        model="qwen", messages=messages, max_tokens=max_tokens, temperature=0, **extra
    ).choices[0]


def check_valid(choice, extra: dict) -> None:
    fmt = extra.get("response_format")
    if fmt is not None:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), fmt["json_schema"]["schema"])
    elif "extra_body" in extra:
        assert choice.finish_reason == "stop" and re.fullmatch(CITY, choice.message.content)


def drop_after_chunks(base: str, chunks: int, started: threading.Event) -> None:
    """A long streamed request whose client leaves after `chunks` chunks (its row is cancelled)."""
    body = {"model": "qwen", "messages": ask("Tell me a long story."), "max_tokens": 200, "stream": True}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as response:
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen == 2:
                started.set()
            if seen >= chunks:
                return


def test_concurrent_requests_equal_one_at_a_time(qwen_model):
    """Six requests (two schemas, a regex, free text, a stop string) at once, beside a streamed one
    whose client leaves: each equals, at temperature 0, the same request sent alone; constrained
    outputs are valid."""
    config = ServerConfig(model_name="qwen", max_tokens=256, max_batch=8, prompt_cache_bytes=0)
    with serve_in_thread(qwen_model, config) as base:
        alone = [create(base, messages, extra) for messages, extra in REQUESTS]
        started = threading.Event()
        with ThreadPoolExecutor(len(REQUESTS) + 1) as pool:
            dropped = pool.submit(drop_after_chunks, base, 6, started)
            started.wait(300)  # the dropped request is decoding before the others join
            together = list(pool.map(lambda r: create(base, *r), REQUESTS))
            dropped.result()
        after = create(base, *REQUESTS[3])  # the batch is usable after the cancelled row left
    for (messages, extra), a, t in zip(REQUESTS, alone, together, strict=False):
        check_valid(a, extra)
        assert (t.message.content, t.finish_reason) == (a.message.content, a.finish_reason), messages
    assert alone[5].finish_reason == "stop" and "Four" not in alone[5].message.content, alone[5].message.content
    assert after.message.content == alone[3].message.content


def test_prefix_cache_changes_no_response(qwen_model):
    """Exact repeat, shared system prompt, follow-up turn: the same responses with the cache on and
    off; with it on, each of them reuses cached tokens."""
    system = {"role": "system", "content": "You are a helpful assistant who answers in one short sentence."}
    first = [system] + ask("What is the boiling point of water?")
    other = [system] + ask("What colour is the sky?")

    def conversation(base: str) -> tuple[list[str], list[int]]:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
        replies = []
        for messages in (first, first, other, None):
            if messages is None:  # the follow-up turn
                messages = first + [{"role": "assistant", "content": replies[0].choices[0].message.content}]
                messages += ask("And in Fahrenheit?")
            replies.append(
                client.chat.completions.create(model="qwen", messages=messages, max_tokens=16, temperature=0)
            )
        return [r.choices[0].message.content for r in replies], [
            r.usage.prompt_tokens_details.cached_tokens for r in replies
        ]

    results = {}
    for size in (0, 1 << 28):
        config = ServerConfig(model_name="qwen", max_tokens=64, prompt_cache_bytes=size)
        with serve_in_thread(qwen_model, config) as base:
            results[size] = conversation(base)
    (off, off_cached), (on, on_cached) = results[0], results[1 << 28]
    assert on == off
    assert off_cached == [0, 0, 0, 0]
    assert on_cached[0] == 0 and all(n > 10 for n in on_cached[1:]), on_cached
    assert on_cached[3] > on_cached[1]  # the follow-up reused the first turn, its reply included


def test_max_batch_must_be_positive(tiny_model):
    with pytest.raises(ValueError, match="max_batch"):
        with serve_in_thread(tiny_model, ServerConfig(max_batch=0)):
            pass
