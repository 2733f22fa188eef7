"""Every route and method of the server fuzzed by schemathesis from the server's own OpenAPI
document (`/openapi.json`), on the tiny model: inputs valid and invalid by each route's schema, and
the checks that no response is a 5xx, none takes longer than `MAX_RESPONSE_SECONDS` (a hang), and
every response matches the status codes, content types and schemas the document gives.

schemathesis runs as its own process (its command line), so its pytest plugin and Hypothesis'
state never enter this test process. The fast lane runs the fuzzing phase, a bounded number of cases
per operation (`COREAI_FUZZ_EXAMPLES`, default 25); `make fuzz` adds the coverage phase (the schema's
boundary values, some thousands of cases), runs many more and prints the figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread

EXAMPLES = int(os.environ.get("COREAI_FUZZ_EXAMPLES", "25"))
PHASES = os.environ.get("COREAI_FUZZ_PHASES", "fuzzing")
MAX_RESPONSE_SECONDS = 30
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


@pytest.fixture(scope="module")
def fuzzed(tiny_model):
    # Short generations: the fuzzer's bodies ask for up to max_tokens, over it is a 400.
    # Every model name is served (alias "*"), so the bodies reach generation rather than a 404.
    config = ServerConfig(model_name="tiny", aliases=("*",), max_tokens=16, max_queue=64, shutdown_timeout=1.0)
    with serve_in_thread(tiny_model, config) as base:
        yield base


def test_every_route_survives_schemathesis(fuzzed, tmp_path):
    command = [sys.executable, "-m", "schemathesis.cli", "run", fuzzed + "/openapi.json"]
    command += ["--checks", CHECKS, "--max-examples", str(EXAMPLES), "--seed", "48", "--workers", "1"]
    command += ["--phases", PHASES, "--generation-database", "none", "--no-color"]
    command += ["--max-response-time", str(MAX_RESPONSE_SECONDS), "--request-timeout", str(MAX_RESPONSE_SECONDS)]
    command += ["--suppress-health-check", "all", "--report", "ndjson", "--report-dir", str(tmp_path)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=1500, cwd=tmp_path)
    summary = run.stdout[-6000:]
    print(summary)  # `make fuzz` shows the figures
    operations = re.search(r"Selected: (\d+)/(\d+)", run.stdout)
    assert operations and operations.group(1) == operations.group(2), summary  # every route and method
    assert run.returncode == 0, summary + run.stderr[-3000:]


def test_found_by_the_fuzzer_an_input_item_whose_type_is_not_a_string(fuzzed):
    """Was a 500 (an unhashable `type` reached the item union's tag lookup); a 400 naming the input."""
    r = httpx.post(fuzzed + "/v1/responses", json={"model": "tiny", "input": [{"type": {}, "call_id": ""}]})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("input"), r.text
