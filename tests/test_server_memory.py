"""KV-memory admission (`coreai.service.memory`, `coreai serve --max-kv-bytes`): with a bound that
holds one row, a second request waits for the first to end although the batch has room, a request
that could never fit is a 400 naming max_tokens, and /health reports the figures."""

from __future__ import annotations

import httpx
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from coreai.service.memory import MIN_DEFAULT, STEP, KVBudget, default_max_kv_bytes, kv_bytes_per_token


def test_bytes_per_token_is_what_a_kv_cache_takes(tiny_model):
    cache = make_prompt_cache(tiny_model.network)
    tiny_model.network(mx.array([[1, 2, 3, 4, 5]]), cache=cache)
    held = sum(c.nbytes for c in cache)  # mlx-lm's cache holds STEP positions at first
    assert held == STEP * kv_bytes_per_token(tiny_model)
    assert default_max_kv_bytes(tiny_model, 1 << 30) >= MIN_DEFAULT


def test_a_config_without_the_kv_size_turns_admission_off(tiny_model, monkeypatch):
    monkeypatch.setattr(tiny_model, "config", {"model_type": "unknown"})
    assert kv_bytes_per_token(tiny_model) == 0
    assert KVBudget(0, 1).fits([(10**6, 10**6)], (10**6, 10**6))  # nothing is bounded


def test_budget_counts_rows_padded_to_the_longest():
    budget = KVBudget(bytes_per_token=10, max_bytes=2 * 512 * 10)
    assert budget.bytes([(10, 20)]) == STEP * 10  # rounded up to mlx-lm's step
    assert budget.bytes([(10, 20), (300, 100)]) == 2 * 512 * 10  # two rows as long as the longest
    assert budget.fits([(300, 100)], (10, 20)) and not budget.fits([(300, 100), (1, 1)], (1, 1))


def test_a_request_that_does_not_fit_waits_and_one_that_never_could_is_refused(slow_tiny_model):
    one_row = STEP * kv_bytes_per_token(slow_tiny_model)  # one row of up to 256 positions
    config = ServerConfig(model_name="tiny", max_tokens=480, max_batch=4, max_kv_bytes=one_row)
    with serve_in_thread(slow_tiny_model, config) as base:
        url = base + "/v1/chat/completions"
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0, "seed": 1}
        too_long = httpx.post(url, json={**body, "max_tokens": 400})
        error = too_long.json()["error"]
        assert too_long.status_code == 400 and error["code"] == "kv_memory_exceeded", too_long.text
        assert error["param"] == "max_tokens" and "--max-kv-bytes" in error["message"]
        with httpx.stream("POST", url, json={**body, "max_tokens": 200, "stream": True}, timeout=60) as first:
            lines = first.iter_lines()
            assert next(lines).startswith("data: ")  # it runs
            second = {**body, "max_tokens": 200, "stream": True}
            with httpx.stream("POST", url, json=second, timeout=60) as waiting:
                health = httpx.get(base + "/health").json()
                assert (health["running"], health["waiting"]) == (1, 1)  # the batch has room, memory not
                assert health["memory"]["max_kv_bytes"] == one_row
                assert 0 < health["memory"]["kv_bytes"] <= one_row
                list(lines)  # the first ends ...
                events = [line for line in waiting.iter_lines() if line.startswith("data: ")]
                assert events[-1] == "data: [DONE]" and len(events) > 3  # ... and the second runs
        assert httpx.get(base + "/health").json()["memory"]["kv_bytes"] == 0


def test_a_lost_model_ends_the_waiting_jobs_too():
    """`Worker.fail` (a lost distributed model: the worker thread is stuck in a collective) ends the
    waiting jobs with the error as well as the running ones: nobody would ever take them."""
    import asyncio

    from coreai.service.worker import Closed, Worker

    class Idle:  # a batch never stepped: the worker thread is not started
        def __len__(self):
            return 0

    async def scenario():
        worker = Worker(max_queue=4, max_batch=1, batch=Idle())  # type: ignore[arg-type]
        waiting = worker.submit(["a", "b"])
        worker.fail(RuntimeError("lost"))
        for job in waiting:
            try:
                await asyncio.wait_for(job.get(), 5)
            except RuntimeError as exc:
                assert str(exc) == "lost"
            else:
                raise AssertionError("a waiting job was not ended")
        assert worker.load() == (0, 0)
        try:
            worker.submit(["c"])
        except Closed as exc:
            assert "lost" in str(exc)

    asyncio.run(scenario())
