"""Issue 24 (fail closed): padding ids in free decoding, empty or vacuous constraints, logprobs at a
stop string, and the smaller faults a new user met (non-UTF-8 bodies, `messages[].name`,
`result.parsed`). Real parts: the real Qwen tokenizer, a real server on loopback, the `openai` client."""

from __future__ import annotations

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
def test_free_decoding_never_draws_padding_ids(tiny_model, temperature):
    """logit_bias +100 on padding ids would make them the argmax; the padding mask keeps them at -inf."""
    assert tiny_model.tokenizer.padding_ids(tiny_model.vocab_size) == frozenset(range(151665, 151936))
    bias = {i: 100 for i in PAD}
    result = tiny_model.generate(
        "Hello", max_tokens=8, sampling=SamplingParams(temperature=temperature, seed=3, logit_bias=bias)
    )
    assert len(result.token_ids) == 8 and not set(result.token_ids) & set(range(151665, 151936))


def test_ids_past_the_tokenizer_are_never_drawn(tiny_model_dir, write_tiny_network, tmp_path):
    """A logit width wider than the tokenizer (as many exported models have): the extra ids too."""
    for f in tiny_model_dir.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, tmp_path / f.name)
    write_tiny_network(tmp_path, "qwen2", vocab_size=151936 + 64)
    wide = load_model(tmp_path)
    assert max(wide.tokenizer.padding_ids(wide.vocab_size)) == 151936 + 63
    bias = {151936: 100, 151999: 100, 151700: 100}
    for temperature in (0.0, 2.0):
        sampling = SamplingParams(temperature=temperature, seed=5, logit_bias=bias)
        result = wide.generate("Hello", max_tokens=6, sampling=sampling, logprobs=True)
        assert not set(result.token_ids) & (set(range(151665, 151936 + 64))), result.token_ids


def test_server_free_decoding_never_draws_padding_ids(tiny):
    r = post(tiny, max_tokens=6, logit_bias={str(i): 100 for i in PAD}, logprobs=True, top_logprobs=3)
    assert r.status_code == 200, r.text
    tops = [t for c in r.json()["choices"][0]["logprobs"]["content"] for t in c["top_logprobs"]]
    assert tops and not any(t["token"].startswith("[PAD") for t in tops)
