"""The grammar journal: compiles recorded on disk and compiled again after a restart (a new cache,
as in a new process), keyed by the tokenizer's fingerprint and the engine's version."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from guided import GrammarCache, build_tokenizer_info, get_tokenizer_info, make_spec
from guided.journal import GrammarJournal

SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "array", "items": {"type": "string"}, "uniqueItems": True},  # validate-and-rollback
]


@pytest.fixture(scope="module")
def info(tiny_model):
    return get_tokenizer_info(tiny_model.tokenizer.hf, tiny_model.vocab_size, tiny_model.tokenizer.eos_ids)


def test_a_restart_finds_what_was_compiled(info, tmp_path):
    journal = GrammarJournal(tmp_path, info)
    first = GrammarCache()
    first.persist(journal)
    specs = [make_spec(schema=s) for s in SCHEMAS]
    for spec in specs:
        first.get(spec, info)
    assert len(list(journal.dir.glob("*.json"))) == 2
    assert info.fingerprint[:16] in journal.dir.name and "llguidance" in journal.dir.name

    second = GrammarCache()  # a new process: nothing compiled yet
    assert second.warm(GrammarJournal(tmp_path, info)) == 2
    compiled = second.get(specs[1], info)
    assert second.stats().hits == 1 and second.stats().misses == 2  # the warm-up's compiles, then a hit
    assert [n.keyword for n in compiled.validated] == ["uniqueItems"] and compiled.checks is not None


def test_bad_entries_are_skipped_and_removed(info, tmp_path):
    journal = GrammarJournal(tmp_path, info)
    cache = GrammarCache()
    cache.persist(journal)
    cache.get(make_spec(schema=SCHEMAS[0]), info)
    (journal.dir / "truncated.json").write_text('{"kind": "json_sch')
    assert [s.schema for s in journal.specs()] == [SCHEMAS[0]]
    assert not (journal.dir / "truncated.json").exists()


def test_another_tokenizer_has_its_own_entries(info, tiny_model, tmp_path):
    tok, width = tiny_model.tokenizer, tiny_model.vocab_size
    wider = get_tokenizer_info(tok.hf, width + 128, tok.eos_ids)  # another logit width
    assert wider.fingerprint != info.fingerprint
    assert build_tokenizer_info(tok.hf, width, tok.eos_ids).fingerprint == info.fingerprint
    cache = GrammarCache()
    cache.persist(GrammarJournal(tmp_path, info))
    cache.get(make_spec(schema=SCHEMAS[0]), wider)  # compiled for the other one: not recorded in this journal
    assert GrammarJournal(tmp_path, wider).specs() == [] and GrammarJournal(tmp_path, info).specs() == []


def test_the_server_records_and_warms(tiny_model, tmp_path):
    schema = {"type": "object", "properties": {"journaled": {"type": "boolean"}}, "required": ["journaled"]}
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "j", "schema": schema}},
    }
    config = ServerConfig(model_name="tiny", grammar_journal=str(tmp_path))
    with serve_in_thread(tiny_model, config, grammar_cache=(first := GrammarCache())) as base:
        assert httpx.post(base + "/v1/chat/completions", json=body, timeout=60).status_code == 200
        assert first.stats().size >= 1  # the server's own cache, not the process-wide one
    info = get_tokenizer_info(tiny_model.tokenizer.hf, tiny_model.vocab_size, tiny_model.tokenizer.eos_ids)
    assert schema in [s.schema for s in GrammarJournal(tmp_path, info).specs()]
    assert first.journal is None  # a stopped server records no more
    restarted = GrammarCache()  # as after a restart
    with serve_in_thread(tiny_model, config, grammar_cache=restarted):
        deadline = time.monotonic() + 30
        while not restarted.stats().size and time.monotonic() < deadline:
            time.sleep(0.05)  # the warm-up runs on a background thread
        assert restarted.stats().size >= 1


def test_a_stopped_warm_up_compiles_nothing_more(qwen_tokenizer, tmp_path):
    """`warm(stop=...)` ends before the next compile once `stop` is set (the server's shutdown)."""
    info = get_tokenizer_info(qwen_tokenizer.hf, 151_936, qwen_tokenizer.eos_ids)
    journal = GrammarJournal(tmp_path, info)
    for schema in SCHEMAS:
        journal.record(make_spec(schema=schema))
    stop = threading.Event()
    stop.set()
    cache = GrammarCache()
    assert cache.warm(journal, stop=stop) == 0 and cache.stats().size == 0
    assert cache.warm(journal, stop=threading.Event()) == len(SCHEMAS)
