"""Smoke test of `python -m benchmarks.agent_soak`: a few seconds of the recorded agent sessions on the
tiny long-context network, every request sent as a resend and with a forced tool; the report is
complete and nothing failed (not how fast)."""

from __future__ import annotations

import json

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from benchmarks import agent_soak


def test_the_recorded_sessions_replay_with_resends(tmp_path):
    out = tmp_path / "agent_soak.json"
    args = ["--minutes", "0.1", "--clients", "2", "--resend-rate", "1", "--forced-tool-rate", "1"]
    report = agent_soak.main([*args, "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["server_errors_5xx"] == 0 and report["hangs"] == 0, report["by_status"]
    assert report["error_events"] == 0 and report["unended_streams"] == 0, report
    assert report["by_kind"]["abandoned"] > 0 and report["resends_sent"] == report["by_kind"]["abandoned"]
    valid, total = map(int, report["tool_inputs_valid"].split("/"))
    assert valid == total, report["tool_inputs_invalid"]
    # Claude Code's two system+tools sets and Codex's three (turns, compactions, a turn after one).
    assert report["distinct_prefixes"] == {
        "claude_code": 2,
        "claude_code_other_question": 1,
        "codex": 3,
        "total": 5,
    }
    delta = report["server_stats_delta"]
    assert delta["prefills"] > 0 and delta["prefill_tokens"] > 0
    held = delta["resends"]
    assert held["held"] == held["attached"] + held["expired"]  # the run waits out the grace: none left held
    assert report["rows_left"] == {"running": 0, "waiting": 0}
    assert report["rss_mib"]["end"] > 0 and "opencode" in report["opencode"]
    assert report["server_exit_code"] in (0, -15, 143)  # SIGTERM: uvicorn re-raises it once stopped
