"""The `coreai` command line: output, exit codes, and one-line errors instead of tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from coreai.cli import main


def test_models_list_names_the_registry(capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b-instruct" in out and "gemma-3-270m" in out and "(default)" in out


def test_generate_with_schema_prints_valid_json(tiny_model_dir, capsys):
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    code = main(["generate", str(tiny_model_dir), "--prompt", "Give n.", "--schema", schema, "--max-tokens", "40",
                 "--temperature", "0.7", "--seed", "3"])
    captured = capsys.readouterr()
    if code == 0:
        value = json.loads(captured.out.strip())
        assert isinstance(value["n"], int) and list(value) == ["n"]
    else:  # a random network may not finish within 40 tokens: then it must say so, not print as valid
        assert "finish=length" in captured.err


def test_generate_choice_and_stream(tiny_model_dir, capsys):
    assert main(["generate", str(tiny_model_dir), "--prompt", "x", "--choice", "yes", "--choice", "no", "--stream"]) == 0
    assert capsys.readouterr().out.strip() in ("yes", "no")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "no-such-model", "--prompt", "x"], "no-such-model"),
        (["generate", "{tiny}", "--prompt", "x", "--temperature", "-1"], "temperature"),
        (["generate", "{tiny}", "--prompt", "x", "--schema", '{"type": "object", "minProperties": "two"}'], "minProperties"),
        (["generate", "{tiny}", "--prompt", "x", "--regex", "("], "regex"),
        (["models", "path", "nope"], "known models"),
        (["generate", "{tiny}", "--prompt", "x", "--seed", "-1"], "seed"),
        (["generate", "{tiny}", "--prompt", "x", "--max-tokens", "0"], "max-tokens"),
        (["generate", "{tiny}", "--prompt", "x", "--schema", "false"], "false"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(tiny_model_dir, capsys, argv, message):
    argv = [a.replace("{tiny}", str(tiny_model_dir)) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith(f"coreai {argv[0]}: error: ") and message in err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "coreai.cli", "models", "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "qwen2.5-coder-0.5b-instruct" in out.stdout


def test_truncated_constrained_output_exits_non_zero(tiny_model_dir, capsys):
    schema = '{"type": "object", "properties": {"text": {"type": "string", "minLength": 50}}, "required": ["text"]}'
    assert main(["generate", str(tiny_model_dir), "--prompt", "x", "--schema", schema, "--max-tokens", "3"]) == 1
    err = capsys.readouterr().err
    assert "finish=length" in err and "invalid output" in err and "incomplete" in err


def test_schema_true_inline(tiny_model_dir, capsys):
    code = main(["generate", str(tiny_model_dir), "--prompt", "x", "--schema", "true", "--max-tokens", "30",
                 "--temperature", "0.8", "--seed", "2"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out) is not None or "invalid output" in err
