"""The prefix cache kept across a restart (`--prompt-cache-dir`, `coreai.service.prefix_store`): a
real server on loopback, stopped and started again on the same folder, serves its first request's
prompt from the cache; another model's files are not read."""

from __future__ import annotations

import anthropic
from test_reasoning import qwen3  # noqa: F401 - another tiny network

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread

ASK = [{"role": "user", "content": "Tell me about the sea and the ships on it, and their long journeys. " * 8}]


def _usage(base: str):
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    return client.messages.create(model="tiny", max_tokens=4, system="You are brief.", messages=ASK).usage


def test_the_prefix_cache_survives_a_restart(tiny_model, tmp_path):
    config = ServerConfig(model_name="tiny", temperature=0.0, prompt_cache_dir=str(tmp_path / "kv"))
    with serve_in_thread(tiny_model, config) as base:
        cold = _usage(base)
    assert cold.cache_read_input_tokens == 0 and cold.input_tokens > 100
    kept = list((tmp_path / "kv").glob("*.safetensors"))
    assert len(kept) == 1  # written when the server stopped
    with serve_in_thread(tiny_model, config) as base:
        warm = _usage(base)
    prompt = cold.input_tokens
    assert warm.input_tokens + warm.cache_read_input_tokens == prompt
    assert warm.cache_read_input_tokens >= prompt - 1  # the whole prompt but the token fed again


def test_without_the_folder_nothing_is_kept_and_another_model_reads_none(tiny_model, qwen3, tmp_path):  # noqa: F811
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny", temperature=0.0)) as base:
        _usage(base)
    assert not list(tmp_path.iterdir())
    config = ServerConfig(model_name="tiny", temperature=0.0, prompt_cache_dir=str(tmp_path))
    with serve_in_thread(tiny_model, config) as base:
        _usage(base)
    with serve_in_thread(qwen3, config) as base:  # another network: its own fingerprint
        assert _usage(base).cache_read_input_tokens == 0
