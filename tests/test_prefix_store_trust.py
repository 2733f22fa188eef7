"""A `--prompt-cache-dir` you can trust (`coreai.service.prefix_store`): real servers on loopback over
a folder whose files were truncated, overwritten with random bytes, copied from another model, or
kept for weights since rewritten at the same path; each such file is skipped with one warning naming
it, the server starts and answers without reading it. Files are written whole or not at all."""

from __future__ import annotations

import logging
import os
import shutil

import anthropic
import pytest
from test_reasoning import qwen3  # noqa: F401 - another tiny network

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from coreai.service import prefix_store
from runtime import load_model

ASK = [{"role": "user", "content": "Tell me about the sea and the ships on it, and their long journeys. " * 8}]


def _usage(base: str):
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    return client.messages.create(model="tiny", max_tokens=4, system="You are brief.", messages=ASK).usage


def _config(folder) -> ServerConfig:
    return ServerConfig(model_name="tiny", temperature=0.0, prompt_cache_dir=str(folder))


def _kept(folder) -> list:
    return sorted(p for p in folder.glob("*.safetensors") if not p.name.startswith("."))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "coreai.service" and r.levelno >= logging.WARNING]


def _first_run(model, folder) -> list:
    with serve_in_thread(model, _config(folder)) as base:
        _usage(base)
    kept = _kept(folder)
    assert len(kept) == 1
    return kept


@pytest.mark.parametrize("damage", ["truncated", "random bytes"])
def test_a_damaged_file_is_skipped_with_one_warning(tiny_model, tmp_path, caplog, damage):
    folder = tmp_path / "kv"
    (path,) = _first_run(tiny_model, folder)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(len(data)))
    caplog.set_level(logging.WARNING, logger="coreai.service")
    with serve_in_thread(tiny_model, _config(folder)) as base:  # starts
        usage = _usage(base)  # and answers, from no cache
    assert usage.cache_read_input_tokens == 0 and usage.input_tokens > 100
    (warning,) = _warnings(caplog)
    assert path.name in warning and "unreadable" in warning


def test_new_weights_at_the_same_path_do_not_reuse_the_old_entries(tmp_path, write_tiny_tokenizer, write_tiny_network):
    weights = tmp_path / "model"
    weights.mkdir()
    write_tiny_tokenizer(weights)
    write_tiny_network(weights, "qwen2")
    folder = tmp_path / "kv"
    _first_run(load_model(weights), folder)
    with serve_in_thread(load_model(weights), _config(folder)) as base:  # the same weights, loaded again
        usage = _usage(base)
    assert usage.cache_read_input_tokens > 100  # the key is stable across loads
    import mlx.core as mx

    arrays = mx.load(str(weights / "model.safetensors"))
    mx.save_safetensors(str(weights / "model.safetensors"), {k: v * 1.5 for k, v in arrays.items()})
    with serve_in_thread(load_model(weights), _config(folder)) as base:  # same path, config and dtype
        usage = _usage(base)
    assert usage.cache_read_input_tokens == 0


def test_a_file_of_another_model_under_this_models_name_is_skipped(tiny_model, qwen3, tmp_path, caplog):  # noqa: F811
    (theirs,) = _first_run(qwen3, tmp_path / "theirs")
    (ours,) = _first_run(tiny_model, tmp_path / "ours")
    shutil.copyfile(theirs, ours)
    caplog.set_level(logging.WARNING, logger="coreai.service")
    with serve_in_thread(tiny_model, _config(tmp_path / "ours")) as base:
        assert _usage(base).cache_read_input_tokens == 0
    (warning,) = _warnings(caplog)
    assert ours.name in warning and "foreign" in warning


def test_files_are_written_whole_or_not_at_all(tiny_model, tmp_path, caplog, monkeypatch):
    folder = tmp_path / "kv"
    (path,) = _first_run(tiny_model, folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([path.name, prefix_store.MEMO])  # no temp file
    before = path.read_bytes()

    def fails_midway(file_name, cache, metadata=None):  # a full disk: half the bytes, then an error
        with open(file_name, "wb") as f:
            f.write(before[: len(before) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prefix_store, "save_prompt_cache", fails_midway)
    caplog.set_level(logging.WARNING, logger="coreai.service")
    with serve_in_thread(tiny_model, _config(folder)) as base:
        _usage(base)
    assert path.read_bytes() == before  # the file kept before is intact
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # the half-written one is gone
    assert any("not written" in w and "No space left" in w for w in _warnings(caplog))


def test_leftover_temporary_files_are_removed_at_start(tiny_model, tmp_path):
    folder = tmp_path / "kv"
    folder.mkdir()
    stale = folder / f".tmp-{2**22 + 1}-abc{prefix_store.SUFFIX}"  # past any Linux pid: no such process
    stale.write_bytes(b"half a file")
    with serve_in_thread(tiny_model, _config(folder)) as base:
        assert not stale.exists()
        assert _usage(base).cache_read_input_tokens == 0


def test_weights_are_hashed_once_per_version_of_their_file(tmp_path, monkeypatch):
    weights, memo = tmp_path / "model", tmp_path / "kv"
    weights.mkdir()
    model = weights / "model.safetensors"
    model.write_bytes(b"one")
    (weights / "other.safetensors").write_bytes(b"not read by mlx-lm")
    hashed = []
    real = prefix_store.sha256_file
    monkeypatch.setattr(prefix_store, "sha256_file", lambda p: hashed.append(p.name) or real(p))
    first = prefix_store.weights_sha256(weights, memo)
    assert prefix_store.weights_sha256(weights, memo) == first and len(hashed) == 2  # just written: not memoized
    monkeypatch.setattr(prefix_store, "SETTLED_NS", 0)  # as if written long ago
    prefix_store.weights_sha256(weights, memo)
    assert prefix_store.weights_sha256(weights, memo) == first and hashed == ["model.safetensors"] * 3
    model.write_bytes(b"two")  # the same size, a new version
    os.utime(model, ns=(1, 1))  # even with a time of its own choosing
    assert prefix_store.weights_sha256(weights, memo) != first and len(hashed) == 4
    (memo / prefix_store.MEMO).write_text("{not json")  # a damaged memo: ignored, hashed again
    assert prefix_store.weights_sha256(weights, memo) != first and len(hashed) == 5
