"""The agent task benchmark's checkers and transcript readers (`benchmarks.agent_tasks`): every
checker fails on its untouched workspace (with an empty answer, and with a wrong one) and passes on a
hand-made solution; each CLI's JSON events are read into the same counts. No model, no CLI."""

from __future__ import annotations

import pytest

from benchmarks.agent_tasks import transcripts
from benchmarks.agent_tasks.__main__ import table
from benchmarks.agent_tasks.tasks import BY_NAME, TASKS


def test_there_are_enough_tasks_of_each_kind():
    assert len(TASKS) >= 15 and len(BY_NAME) == len(TASKS)
    kinds = {t.kind for t in TASKS}
    assert kinds == {"read", "edit", "run", "none"}


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_the_checker_fails_untouched_and_passes_solved(task, tmp_path):
    untouched, solved = tmp_path / "untouched", tmp_path / "solved"
    task.write(untouched)
    task.write(solved)
    for answer in ("", "I could not find it."):
        ok, why = task.check(untouched, answer)
        assert not ok, (answer, why)
    answer = task.solve(solved)
    ok, why = task.check(solved, answer)
    assert ok, why


def test_a_solved_workspace_with_the_test_changed_fails(tmp_path):
    task = BY_NAME["add_function"]
    task.write(tmp_path)
    task.solve(tmp_path)
    (tmp_path / "test_mathutils.py").write_text("print('ok')\n")  # the test emptied: not a solution
    ok, why = task.check(tmp_path, "")
    assert not ok and "test_mathutils.py was changed" in why


def test_no_tool_fails_when_the_workspace_was_changed(tmp_path):
    task = BY_NAME["no_tool"]
    task.write(tmp_path)
    (tmp_path / "readme.txt").write_text("42\n")
    assert not task.check(tmp_path, "42")[0]


def at(events):
    return [(float(i), e) for i, e in enumerate(events)]


def test_claude_code_events():
    read = {"type": "tool_use", "id": "a", "name": "Read", "input": {"file_path": "x.py"}}
    again = read | {"id": "b"}
    bad = {"type": "tool_use", "id": "c", "name": "Edit", "input": {"path": 1}}
    events = [
        {"type": "system", "subtype": "init"},
        {"type": "assistant", "message": {"content": [read, again]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"}]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "b", "content": "1"}]}},
        {"type": "assistant", "message": {"content": [bad]}},
        {
            "type": "user",
            "message": {
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "c",
                        "is_error": True,
                        "content": "<tool_use_error>InputValidationError: Edit failed</tool_use_error>",
                    }
                ]
            },
        },
        {"type": "result", "result": "It prints 1.", "num_turns": 3, "is_error": False, "usage": {"input_tokens": 9}},
    ]
    t = transcripts.claude(at(events))
    assert t.answer == "It prints 1." and t.turns == 3 and t.first_output_s == 1.0 and t.errors == []
    assert t.counts() == {"tool_calls": 3, "invalid": 1, "errored": 0, "valid": 2, "repeated": 1}


def test_codex_events():
    cmd = {"type": "command_execution", "command": "cat a.py", "exit_code": 0, "status": "completed"}
    failing = cmd | {"command": "python3 t.py", "exit_code": 1, "status": "failed", "aggregated_output": "Error"}
    events = [
        {"type": "thread.started"},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"type": "error", "message": "a warning"}},
        {"type": "item.started", "item": cmd},
        {"type": "item.completed", "item": cmd},
        {"type": "item.completed", "item": cmd},
        {"type": "item.completed", "item": failing},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "Done."}},
        {"type": "turn.completed", "usage": {"input_tokens": 900, "cached_input_tokens": 800}},
    ]
    t = transcripts.codex(at(events))
    assert t.answer == "Done." and t.turns == 1 and t.first_output_s == 3.0 and t.errors == ["a warning"]
    assert t.counts() == {"tool_calls": 3, "invalid": 0, "errored": 1, "valid": 2, "repeated": 1}
    assert t.usage["cached_input_tokens"] == 800
    stderr = (
        "2026-12-07T19:34:54Z ERROR codex_core::tools::router: error=`justification` requires an explicit "
        "`sandbox_permissions`\n"
        "2026-12-07T22:09:07Z ERROR codex_core::tools::router: error=write_stdin failed: Unknown process id 1\n"
    )
    t = transcripts.refused("codex", t, stderr + "Reading additional input from stdin...\n")
    assert t.counts() == {"tool_calls": 5, "invalid": 1, "errored": 2, "valid": 2, "repeated": 1}


def test_opencode_events():
    ok = {"tool": "read", "state": {"status": "completed", "input": {"filePath": "a"}}}
    bad = {"tool": "edit", "state": {"status": "error", "input": {}, "error": "Invalid input: expected string"}}
    unread = {"tool": "task", "error": "Invalid input for tool task: JSON parsing failed: Text: {"}
    events = [
        {"type": "step_start", "part": {}},
        {"type": "tool_use", "part": ok},
        {"type": "step_finish", "part": {"tokens": {"input": 100, "output": 5, "cache": {"read": 10}}}},
        {"type": "step_start", "part": {}},
        {"type": "tool_use", "part": bad},
        {"type": "tool_use", "part": {"tool": "invalid", "state": {"status": "completed", "input": unread}}},
        {"type": "text", "part": {"text": "The answer "}},
        {"type": "text", "part": {"text": "is 4471."}},
        {"type": "step_finish", "part": {"tokens": {"input": 120, "output": 7, "cache": {"read": 100}}}},
    ]
    t = transcripts.opencode(at(events))
    assert t.answer == "The answer is 4471." and t.turns == 2 and t.first_output_s == 1.0
    assert t.counts() == {"tool_calls": 3, "invalid": 2, "errored": 0, "valid": 1, "repeated": 0}
    assert t.calls[-1].name == "task"
    assert t.usage == {"input": 220, "output": 12, "cache_read": 110}


def test_the_table_has_a_row_per_task():
    row = {"task": "read_answer", "passed": True, "exit_code": 0, "tool_calls": 1, "valid": 1, "invalid": 0}
    row |= {"errored": 0, "repeated": 0, "turns": 2, "model_requests": 2, "prompt_tokens": 1000}
    row |= {"cached_share": 0.5, "first_output_s": None, "wall_s": 3.2}
    lines = table([row]).splitlines()
    assert len(lines) == 3 and lines[2] == "read_answer | yes | 0 | 1 | 1 | 0 | 0 | 0 | 2 | 2 | 1000 | 50% | - | 3.2"
