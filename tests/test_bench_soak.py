"""Smoke test of `python -m benchmarks.soak`: a few seconds of the mixed load on the tiny model; the
report is complete and nothing failed (not how fast)."""

from __future__ import annotations

import json

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from benchmarks import soak


def test_soak_runs_and_reports(tiny_model_dir, tmp_path):
    out = tmp_path / "soak.json"
    report = soak.main([str(tiny_model_dir), "--minutes", "0.15", "--clients", "4", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert set(report["by_kind"]) == set(soak.KINDS), report["by_kind"]  # every kind was sent
    assert report["server_errors_5xx"] == 0 and report["no_answer"] == 0, report["by_status"]
    valid, total = map(int, report["constrained_valid"].split("/"))
    assert total > 0 and valid == total
    refused, bad = map(int, report["bad_inputs_refused_4xx"].split("/"))
    assert refused == bad > 0
    assert report["rows_left"] == {"running": 0, "waiting": 0}
    assert report["rss_mib"]["end"] > 0
    assert report["server_exit_code"] in (0, -15, 143)  # SIGTERM: uvicorn re-raises it once stopped
