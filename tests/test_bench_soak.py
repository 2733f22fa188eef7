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


def test_soak_at_two_ranks_with_a_stopped_rank(tiny_model_dir, tmp_path):
    """`--ranks 2`: the mixed load under mlx.launch, then rank 1 SIGSTOPped: rank 0 ends non-zero
    and the requests running at the stop end (an error, not a hang)."""
    # A rank timeout well above a step on a loaded machine (a slow step must not count as a lost rank).
    args = [str(tiny_model_dir), "--ranks", "2", "--minutes", "0.1", "--clients", "4", "--stop-seconds", "14"]
    report = soak.main([*args, "--rank-timeout", "8", "--out", str(tmp_path / "soak.json")])
    assert report["server_errors_5xx"] == 0 and report["no_answer"] == 0, report["by_status"]
    fault = report["fault"]
    assert fault["rank0_exit_code"] not in (None, 0), fault
    assert fault["running_at_stop"] > 0, fault
    # Each API's error: a 503 (529 on Messages) before a stream began, an error event in one that had;
    # never a connection cut or a hang (a waiting request too). A whole 200 is one whose last step
    # ran before the stop took hold (CI's stop-52 run had one).
    ends = fault["how_they_ended"]
    assert all(end in ("503", "529", "200 whole") or end.endswith("error event") for end in ends), fault
    assert ends.get("200 whole", 0) < fault["running_at_stop"], fault  # the stop ended some
    refused, bad = map(int, fault["bad_inputs_refused_4xx"].split("/"))
    assert refused == bad, fault  # a bad input running across the stop: still refused, not a 5xx
    assert fault["longest_to_end_after_stop_s"] < 8 + 30, fault  # the rank timeout, the grace and slack
