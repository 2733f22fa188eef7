"""`coreai serve` stops in order on Ctrl-C (SIGINT) and on SIGTERM (what `kill`, systemd and
launchd send): the real command in a subprocess on loopback, requests
(constrained ones, recorded by the grammar journal, which is replayed at start-up; one in flight),
then SIGINT. New generations are refused (503) while the running one gets its grace, then it is
cancelled, and the worker and journal threads are joined before the interpreter exits: a thread
still inside MLX or llguidance then aborted the process ("terminate called without an active
exception", status -6)."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from guided import get_tokenizer_info, make_spec
from guided.journal import GrammarJournal
from runtime.blas import blas_in_use

ROOT = Path(__file__).resolve().parents[1]
GRACE = 3.0  # --shutdown-timeout: seconds the running generation gets after Ctrl-C


def journal_schemas(n: int) -> list[dict]:
    """`n` distinct object schemas, each a grammar of its own to compile."""
    return [
        {"type": "object", "properties": {f"field_{i}": {"type": "integer", "minimum": i}}, "required": [f"field_{i}"]}
        for i in range(n)
    ]


def start_server(model_dir: Path, journal: Path) -> tuple[subprocess.Popen, str]:
    """`coreai -v serve` on a free loopback port; returns the process and its base URL."""
    argv = [sys.executable, "-m", "coreai", "-v", "serve", str(model_dir), "--port", "0"]
    argv += ["--grammar-journal", str(journal), "--max-tokens", "480", "--shutdown-timeout", str(GRACE)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        line = lines.get(timeout=300)  # the first line says where it serves (after the model load)
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"the server did not start: {proc.communicate()[1]}") from None
    assert line.startswith("coreai serve: "), line
    blas = lines.get(timeout=30)  # then the BLAS and its threads (issue 60)
    assert blas.startswith("coreai serve: BLAS ") and blas_in_use().split(",")[0] in blas, blas
    return proc, line.split(" on ", 1)[1].split("/v1", 1)[0]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_joins_the_worker_and_journal_threads(tiny_model, tiny_model_dir, tmp_path, signum):
    journal = tmp_path / "journal"
    info = get_tokenizer_info(tiny_model.tokenizer.hf, tiny_model.vocab_size, tiny_model.tokenizer.eos_ids)
    recorded = GrammarJournal(journal, info)
    for schema in journal_schemas(40):  # compiled again at start-up, on the journal thread
        recorded.record(make_spec(schema=schema))
    proc, base = start_server(tiny_model_dir, journal)
    try:
        chat = base + "/v1/chat/completions"
        user = [{"role": "user", "content": "Say something."}]
        name = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
        for seed in range(4):
            body = {"model": name, "messages": user, "max_tokens": 4, "temperature": 1.0, "seed": seed}
            assert httpx.post(chat, json=body, timeout=120).status_code == 200
        fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": journal_schemas(41)[-1]}}
        body = {"model": name, "messages": user, "max_tokens": 16, "response_format": fmt}
        assert httpx.post(chat, json=body, timeout=120).status_code == 200
        long = {"model": name, "messages": user, "max_tokens": 450, "temperature": 1.0, "seed": 1, "stream": True}
        with httpx.stream("POST", chat, json=long, timeout=120) as stream:
            events = (line for line in stream.iter_lines() if line.startswith("data: "))
            next(events), next(events)  # tokens flow: the generation is in flight
            proc.send_signal(signum)
            deadline = time.monotonic() + GRACE
            short = {"model": name, "messages": user, "max_tokens": 2}
            while (refused := httpx.post(chat, json=short, timeout=60)).status_code == 200:
                assert time.monotonic() < deadline, f"still admitting generations after {signum.name}"
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
            rest = list(events)  # the grace, then the server cancels it and ends the stream
            assert rest[-1] == "data: [DONE]" and '"finish_reason"' in rest[-2], rest[-2:]
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # uvicorn re-raises the stop signal once shut down, so the status says which signal ended it.
    assert proc.returncode in (0, -signum, 128 + signum), (proc.returncode, err)
    assert "terminate called" not in err and "Traceback" not in err, err
    assert "the generation thread stopped" in err, err
    assert "the grammar-journal thread stopped" in err, err
