"""runtime.attention: the long-context attention of the engine's passes on the CPU (softmax in NumPy)
against MLX's fused call, the gate that keeps everything else on the fused call bit for bit, the
guards that fall back to it (the COREAI_CPU_ATTENTION switch, mlx-lm's signature checked at install,
the in-place write checked on the scores buffer), and the real path: a tiny network's greedy tokens
at a 1,500-token context, alone and batched, against mlx-lm's own generation."""

from __future__ import annotations

import logging

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base, qwen2
from mlx_lm.models.cache import make_prompt_cache

from runtime import attention
from runtime.batch import BatchGenerator
from runtime.sampling import SamplingParams, SamplingStrategy


def inputs(batch, heads, kv_heads, queries, keys, seed=0, value_dim=16):
    mx.random.seed(seed)
    q = mx.random.normal((batch, heads, queries, 16))
    k = mx.random.normal((batch, kv_heads, keys, 16))
    v = mx.random.normal((batch, kv_heads, keys, value_dim))
    return q, k, v


def left_padding_mask(batch, queries, keys):
    """What mlx-lm's BatchKVCache gives a batch whose rows are left-padded by 0, 5, 10, ... keys:
    bool [B, 1, L, S], causal, True attends."""
    qpos = mx.arange(keys - queries, keys)[:, None]
    kpos = mx.arange(keys)[None]
    pads = mx.arange(batch)[:, None, None, None] * 5
    return (qpos >= kpos)[None, None] & (kpos >= pads)


@pytest.mark.parametrize(
    "batch,heads,kv_heads,queries,keys,mask,value_dim",
    [
        (1, 4, 4, 16, 40, None, 16),
        (1, 14, 2, 33, 300, "causal", 16),  # odd rows: the parts differ in size
        (2, 4, 2, 17, 64, "bool", 16),
        (2, 4, 1, 20, 64, "additive", 16),
        (2, 4, 2, 20, 64, "bfloat16", 16),  # an additive mask NumPy has no dtype for
        (1, 4, 2, 1, 50, "causal", 16),  # one query: one part
        (1, 4, 4, 18, 64, "causal", 8),  # MLA models (deepseek_v2, minicpm3): values narrower than keys
    ],
)
def test_it_computes_what_mlx_fused_attention_does(batch, heads, kv_heads, queries, keys, mask, value_dim):
    q, k, v = inputs(batch, heads, kv_heads, queries, keys, value_dim=value_dim)
    kind = mask
    if kind == "bool":
        mask = left_padding_mask(batch, queries, keys)
    elif kind in ("additive", "bfloat16"):
        mask = mx.where(left_padding_mask(batch, queries, keys), 0.0, -mx.inf) + mx.random.normal((1, heads, 1, keys))
        mask = mask.astype(mx.bfloat16) if kind == "bfloat16" else mask
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    got = attention.attention(q, k, v, 0.25, mask)
    assert got.shape == want.shape and got.dtype == mx.float32
    assert mx.allclose(got, want, atol=1e-5, rtol=1e-5).item()


def test_a_row_with_every_key_masked_attends_to_all_alike_as_in_mlx():
    q, k, v = inputs(1, 2, 2, 2, 8)
    mask = mx.array([[True] * 8, [False] * 8])[None, None]
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0, mask=mask)
    got = attention.attention(q, k, v, 1.0, mask)
    assert mx.allclose(got, want, atol=1e-5).item()
    assert mx.allclose(got[0, :, 1], v.mean(axis=2)[0], atol=1e-5).item()


def test_only_the_engines_long_prefill_passes_leave_the_fused_call(monkeypatch):
    attention.install()
    patched = qwen2.scaled_dot_product_attention
    assert patched is not base.scaled_dot_product_attention  # the model module's name now routes
    calls = []
    real = attention.attention
    monkeypatch.setattr(attention, "attention", lambda *a: calls.append(a[0].shape) or real(*a))

    def run(queries, keys):
        q, k, v = inputs(1, 4, 2, queries, keys)
        got = patched(q, k, v, cache=None, scale=0.25, mask="causal")
        return got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")

    long = attention.LONG_CONTEXT
    got, fused = run(attention.MIN_QUERIES, long)  # outside engine(): mlx-lm's own generation
    assert mx.array_equal(got, fused).item() and calls == []
    with attention.engine():
        for queries, keys in ((attention.MIN_QUERIES, long - 1), (attention.MIN_QUERIES - 1, long)):
            got, fused = run(queries, keys)  # short context, or a decode-sized pass
            assert mx.array_equal(got, fused).item() and calls == []
        got, fused = run(attention.MIN_QUERIES, long)
        assert calls == [(1, 4, attention.MIN_QUERIES, 16)]
        assert mx.allclose(got, fused, atol=1e-5).item()
    assert attention.install() == 0  # idempotent: every module already routes


def attention_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "coreai.attention" and r.levelno >= logging.WARNING]


@pytest.fixture
def fresh_warnings(caplog):
    """Warnings are given once a process: forget those of earlier tests, and capture this one's."""
    attention._warn_once.cache_clear()
    caplog.set_level(logging.WARNING, logger="coreai.attention")
    yield caplog
    attention._warn_once.cache_clear()


@pytest.mark.parametrize("value", ["0", "off", " False "])
def test_the_switch_gives_mlx_lms_fused_call_everywhere(monkeypatch, value):
    attention.install()
    routed = qwen2.scaled_dot_product_attention
    assert routed is not base.scaled_dot_product_attention
    calls = []
    monkeypatch.setattr(attention, "attention", lambda *a: calls.append(a) or pytest.fail("not the fused call"))
    monkeypatch.setenv("COREAI_CPU_ATTENTION", value)
    q, k, v = inputs(1, 4, 2, attention.MIN_QUERIES, attention.LONG_CONTEXT)
    with attention.engine():  # an engine pass at long context: the NumPy path, were it on
        assert not attention.applies(q, k, None, None)
        got = routed(q, k, v, cache=None, scale=0.25, mask="causal")
    assert mx.array_equal(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")).item()
    assert calls == []
    # a model loaded with the switch off: its module keeps mlx-lm's own function
    monkeypatch.setattr(qwen2, "scaled_dot_product_attention", base.scaled_dot_product_attention)
    assert attention.install() == 0
    assert qwen2.scaled_dot_product_attention is base.scaled_dot_product_attention


def _new_keyword(queries, keys, values, cache, scale, mask, sinks=None, window=None):
    return base.scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks)


def _renamed(queries, keys, values, cache, scale, attention_mask, sinks=None):
    return base.scaled_dot_product_attention(queries, keys, values, cache, scale, attention_mask, sinks)


def _keyword_only(queries, keys, values, cache, *, scale, mask, sinks=None):
    return base.scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks)


@pytest.mark.parametrize(
    "other,named",
    [(_new_keyword, "new: window=None"), (_renamed, "new: attention_mask; missing: mask"), (_keyword_only, "new: *")],
)
def test_a_new_mlx_lm_signature_is_not_patched_and_warned_once(monkeypatch, fresh_warnings, other, named):
    """A new mlx-lm whose scaled_dot_product_attention takes other parameters: its model modules
    (which bound the new function at import) keep it, and one warning names the difference."""
    monkeypatch.setattr(base, "scaled_dot_product_attention", other)
    monkeypatch.setattr(qwen2, "scaled_dot_product_attention", other)
    assert attention.install() == 0
    assert attention.install() == 0  # a second load: no second warning
    assert qwen2.scaled_dot_product_attention is other
    [warning] = attention_warnings(fresh_warnings)
    assert "not installed" in warning and named in warning and "(queries, keys, values, cache, scale" in warning


@pytest.mark.parametrize(
    "conversion",
    [
        np.array,  # a copy: float32, the shape, contiguous and writable, but MLX never sees a write into it
        lambda a: np.asarray(a)[..., ::-1],  # MLX's buffer, not C-contiguous
        lambda a: np.asarray(a).astype(np.float64),  # another dtype
        lambda a: np.asarray(a).reshape(-1),  # another shape
        lambda a: np.lib.stride_tricks.as_strided(np.asarray(a), writeable=False),  # read-only
    ],
    ids=["copy", "not-contiguous", "float64", "flat", "read-only"],
)
def test_scores_unsafe_to_write_in_place_give_the_fused_call(monkeypatch, fresh_warnings, conversion):
    monkeypatch.setattr(attention, "_as_numpy", conversion)
    calls = []
    monkeypatch.setattr(attention, "_exp_rows", lambda *a: calls.append(a) or pytest.fail("softmax written"))
    q, k, v = inputs(2, 4, 2, 20, 64)
    mask = left_padding_mask(2, 20, 64)
    for _ in range(2):
        got = attention.attention(q, k, v, 0.25, mask)
        assert mx.array_equal(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)).item()
    assert calls == []
    [warning] = attention_warnings(fresh_warnings)
    assert "the softmax is left to MLX's fused attention call" in warning


@pytest.mark.parametrize("first", [None, 0.5])  # 0.5: the element already holds the probe's first value
def test_mlxs_own_buffer_passes_the_check_and_keeps_its_values(first):
    scores = mx.random.normal((1, 2, 3, 5, 7))
    if first is not None:
        scores[0, 0, 0, 0, 0] = first
    mx.eval(scores)
    before = np.array(scores)
    assert attention._unsafe_to_write(scores, np.asarray(scores)) is None
    assert np.array_equal(np.array(scores), before)
    copied = np.array(scores)
    assert "not seen by MLX" in attention._unsafe_to_write(scores, copied)
    assert np.array_equal(copied, before) and np.array_equal(np.array(scores), before)


@pytest.fixture(scope="module")
def long_tiny_model(tmp_path_factory, write_tiny_tokenizer, write_tiny_network):
    from runtime import load_model

    folder = tmp_path_factory.mktemp("tiny-long")
    write_tiny_tokenizer(folder)
    write_tiny_network(folder, "qwen2", max_position_embeddings=4096)
    return load_model(folder)


def test_long_prompts_give_mlx_lms_tokens_alone_and_batched(long_tiny_model, monkeypatch):
    from mlx_lm.generate import generate_step

    model = long_tiny_model
    calls = []
    real = attention.attention
    monkeypatch.setattr(attention, "attention", lambda *a: calls.append(a[2].shape[2]) or real(*a))
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly hex bold jacks "
    prompts = [model.prompt_ids(words * 60)[:n] for n in (1500, 1200)]
    assert all(len(p) == n for p, n in zip(prompts, (1500, 1200), strict=True))

    def stock(ids):  # mlx-lm's generation: outside engine(), the fused call
        steps = generate_step(mx.array(ids), model.network, max_tokens=8, sampler=lambda x: mx.argmax(x, axis=-1))
        return [int(t) for t, _ in steps]

    want = [stock(p) for p in prompts]
    assert calls == []
    alone = [model.generate(p, max_tokens=8, temperature=0.0).token_ids for p in prompts]
    assert alone == want
    assert calls and max(calls) >= 1400  # the prefill chunks at long context took the NumPy path
    calls.clear()
    batch = BatchGenerator(model.network, model.tokenizer, max_batch=2)
    for i, ids in enumerate(prompts):
        batch.add(ids, SamplingStrategy(SamplingParams(temperature=0.0)), max_tokens=8, tag=i)
    results = {}
    while len(batch):
        for row, delta in batch.step():
            if delta.result is not None:
                results[row.tag] = delta.result.token_ids
    assert [results[0], results[1]] == want
    assert calls


def test_a_quantized_kv_cache_keeps_mlx_lms_attention(monkeypatch):
    """mlx-lm's quantized KV cache hands the attention (data, scales, biases) tuples, for its own
    quantized attention: the route must not look into them. (That attention is not compared: on
    this backend two identical calls of it differ.)"""
    from mlx_lm.models.cache import QuantizedKVCache

    attention.install()
    monkeypatch.setattr(attention, "LONG_CONTEXT", 16)  # this context would take the NumPy path
    cache = QuantizedKVCache(group_size=64, bits=8)
    q, k, v = inputs(1, 4, 4, 16, 16)
    q, k, v = (mx.concatenate([a] * 4, axis=-1) for a in (q, k, v))  # head size 64: a quantization group
    keys, values = cache.update_and_fetch(k, v)
    with attention.engine():
        assert not attention.applies(q, keys, cache, None)
        got = qwen2.scaled_dot_product_attention(q, keys, values, cache=cache, scale=0.125, mask=None)
    assert got.shape == q.shape and mx.isfinite(got).all().item()


def test_the_default_model_at_a_long_prompt_gives_mlx_lms_tokens(qwen_model, monkeypatch):
    """The real model (float32 on the CPU) with a 1,100-token prompt: the engine's prefill takes the
    NumPy softmax and its greedy tokens are mlx-lm's own generation's (the fused call)."""
    from mlx_lm.generate import generate_step

    calls = []
    real = attention.attention
    monkeypatch.setattr(attention, "attention", lambda *a: calls.append(a[2].shape[2]) or real(*a))
    text = "def f(x):\n    return x * 2\n" * 120 + "# what does f(21) return?\n"
    ids = qwen_model.prompt_ids(text, chat_template=False)[:1100]
    assert len(ids) == 1100
    steps = generate_step(mx.array(ids), qwen_model.network, max_tokens=12, sampler=lambda x: mx.argmax(x, axis=-1))
    want = [int(t) for t, _ in steps]
    assert calls == []
    got = qwen_model.generate(ids, max_tokens=12, temperature=0.0, chat_template=False).token_ids
    assert got == want
    assert calls and max(calls) >= 1024
    # the logits of one whole-prompt pass (1,100 queries, 1,100 keys), against the fused call's
    net = qwen_model.network
    fused = net(mx.array(ids)[None], cache=make_prompt_cache(net))[0, -1]
    with attention.engine():
        ours = net(mx.array(ids)[None], cache=make_prompt_cache(net))[0, -1]
    assert mx.abs(ours - fused).max().item() < 1e-3 * mx.abs(fused).max().item()
