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
    code = main(
        [
            "generate",
            str(tiny_model_dir),
            "--prompt",
            "Give n.",
            "--schema",
            schema,
            "--max-tokens",
            "40",
            "--temperature",
            "0.7",
            "--seed",
            "3",
        ]
    )
    captured = capsys.readouterr()
    if code == 0:
        value = json.loads(captured.out.strip())
        assert isinstance(value["n"], int) and list(value) == ["n"]
    else:  # a random network may not finish within 40 tokens: then it must say so, not print as valid
        assert "finish=length" in captured.err


@pytest.mark.parametrize("layout", [["--whitespace", "compact"], ["--whitespace", "pretty"], ["--any-whitespace"]])
def test_generate_whitespace_flags(tiny_model_dir, capsys, layout):
    """--whitespace reaches the grammar (compact output has no whitespace at all); the older
    --any-whitespace still parses (as --whitespace any)."""
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    argv = ["generate", str(tiny_model_dir), "--prompt", "Give n.", "--schema", schema, "--max-tokens", "60"]
    code = main(argv + layout)
    captured = capsys.readouterr()
    if code == 0:
        text = captured.out.strip()
        assert list(json.loads(text)) == ["n"]
        if layout[-1] == "compact":
            assert text == json.dumps(json.loads(text), separators=(",", ":"))
    else:  # the random network may not finish: then it says so
        assert "finish=length" in captured.err


def test_generate_refuses_an_unknown_whitespace(tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", str(tiny_model_dir), "--prompt", "x", "--json-object", "--whitespace", "tabs"])
    assert exc.value.code == 2 and "invalid choice: 'tabs'" in capsys.readouterr().err


def test_generate_choice_and_stream(tiny_model_dir, capsys):
    assert (
        main(["generate", str(tiny_model_dir), "--prompt", "x", "--choice", "yes", "--choice", "no", "--stream"]) == 0
    )
    assert capsys.readouterr().out.strip() in ("yes", "no")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "no-such-model", "--prompt", "x"], "no-such-model"),
        (["generate", "{tiny}", "--prompt", "x", "--temperature", "-1"], "temperature"),
        (
            ["generate", "{tiny}", "--prompt", "x", "--schema", '{"type": "object", "minProperties": "two"}'],
            "minProperties",
        ),
        (["generate", "{tiny}", "--prompt", "x", "--regex", "("], "regex"),
        (["models", "path", "nope"], "known models"),
        (["generate", "{tiny}", "--prompt", "x", "--seed", "-1"], "seed"),
        (["generate", "{tiny}", "--prompt", "x", "--max-tokens", "0"], "max-tokens"),
        (["generate", "{tiny}", "--prompt", "x", "--schema", "false"], "false"),
        (["bench", "{tiny}", "--guided", "{unenforceable}", "-g", "2", "-n", "1"], "no-such-format"),
        (["check-schema", "{unenforceable}", "--model", "{tiny}"], "cannot enforce format at /properties/a/format"),
        (["bench", "{tiny}", "--guided", "/", "-g", "2", "-n", "1"], "cannot read the schema file"),
        (["bench", "{tiny}", "--speculative", "prompt_lookup"], "needs --prompt or --messages"),
        (["generate", "{tiny}", "--prompt", "x", "--grammar", "{endless}"], "rule 'start' never ends"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(tiny_model_dir, tmp_path, capsys, argv, message):
    unenforceable = tmp_path / "not.json"
    unenforceable.write_text('{"type": "object", "properties": {"a": {"format": "no-such-format"}}}')
    endless = tmp_path / "endless.lark"
    endless.write_text('start: "a" start\n')
    files = {"{tiny}": tiny_model_dir, "{unenforceable}": unenforceable, "{endless}": endless}
    argv = [str(files.get(a, a)) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith(f"coreai {argv[0]}: error: ") and message in err


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--temperature", "-1", "temperature must be a finite number >= 0"),
        ("--max-batch", "0", "--max-batch must be >= 1"),
        ("--max-body-bytes", "0", "--max-body-bytes must be >= 1"),
        ("--temperature", "inf", "temperature must be a finite number >= 0"),
        ("--repetition-penalty", "0", "--repetition-penalty must be a finite number > 0"),
        ("--port", "99999", "cannot listen on 127.0.0.1:99999"),
    ],
)
def test_serve_refuses_bad_settings_before_it_starts(tiny_model_dir, monkeypatch, capsys, flag, value, message):
    """A server setting that would fail every request (a default temperature out of range answered
    every request leaving temperature out with a 400 blaming the client) is refused at start-up."""
    import uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: pytest.fail("the server started"))
    argv = ["serve", str(tiny_model_dir), "--grammar-journal", "off", flag, value]
    argv += ["--port", "0"] if flag != "--port" else []
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("coreai serve: error: ") and message in err


@pytest.mark.parametrize("flag", ["-n", "-g", "-p"])
def test_bench_counts_must_be_positive(capsys, flag):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", flag, "0"])
    assert exit_.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_bench_speculative_case_files(tiny_model_dir, tmp_path, capsys):
    """`coreai bench --guided CASE.schema.json --messages CASE.messages.json --speculative prompt_lookup`
    runs the speculative variants and reports the outputs identical (tiny model; not how fast)."""
    from benchmarks.guided import CASES

    out = tmp_path / "spec.json"
    assert (
        main(
            [
                "bench",
                str(tiny_model_dir),
                "--guided",
                str(CASES / "fly_to.schema.json"),
                "--messages",
                str(CASES / "fly_to.messages.json"),
                "--speculative",
                "prompt_lookup",
                "-g",
                "8",
                "-n",
                "1",
                "--output-json",
                str(out),
            ]
        )
        == 0
    )
    assert "jump_forward+spec" in capsys.readouterr().out
    (case,) = json.loads(out.read_text())["cases"]
    assert case["identical"] == {"jump_forward+spec": True, "unconstrained+spec": True}
    assert case["prompt"].startswith("Fly to Shenzhen")


@pytest.mark.parametrize("module", ["coreai", "coreai.cli"])
def test_console_script_runs(module):
    """`python -m coreai` works as the `coreai` script does (a user tries it first without the venv's bin)."""
    out = subprocess.run([sys.executable, "-m", module, "models", "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "qwen2.5-coder-0.5b-instruct" in out.stdout


def test_truncated_constrained_output_exits_non_zero(tiny_model_dir, capsys):
    schema = '{"type": "object", "properties": {"text": {"type": "string", "minLength": 50}}, "required": ["text"]}'
    assert main(["generate", str(tiny_model_dir), "--prompt", "x", "--schema", schema, "--max-tokens", "3"]) == 1
    out, err = capsys.readouterr()
    assert "finish=length" in err and "invalid output" in err and "incomplete" in err
    # A pipe's consumer reads nothing rather than a partial value; the partial text is kept on stderr.
    assert out == "" and 'partial output, not valid: {"' in err


def test_schema_true_inline(tiny_model_dir, capsys):
    code = main(
        [
            "generate",
            str(tiny_model_dir),
            "--prompt",
            "x",
            "--schema",
            "true",
            "--max-tokens",
            "30",
            "--temperature",
            "0.8",
            "--seed",
            "2",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out) is not None or "invalid output" in err


@pytest.mark.model
def test_bench_guided_on_the_real_model(qwen_model, tmp_path, capsys, monkeypatch):
    """`coreai bench --guided` end to end on the real Qwen model (tiny settings): the report has its
    fields and every constrained output is valid. Not how fast."""
    from coreai.commands import common

    monkeypatch.setattr(common, "load_model", lambda args: qwen_model)  # the session's model: no second load
    schema = tmp_path / "n.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
    out = tmp_path / "guided.json"
    assert (
        main(
            [
                "bench",
                "--guided",
                str(schema),
                "--prompt",
                "Give n = 7 as JSON.",
                "-g",
                "16",  # the pretty layout writes `{\n  "n": 7\n}`: more tokens than compact
                "-n",
                "1",
                "--output-json",
                str(out),
            ]
        )
        == 0
    )
    assert "jump_forward" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["versions"]["llguidance"] and report["max_tokens"] == 16 and report["repeats"] == 1
    (case,) = report["cases"]
    assert not case["errors"] and set(case["median"]) == {"unconstrained", "mlx_lm", "jump_forward", "no_jump_forward"}
    for name in ("jump_forward", "no_jump_forward"):
        m = case["median"][name]
        assert m["valid"] and isinstance(json.loads(m["text"])["n"], int)
        for key in (
            "decode_tps",
            "ttft",
            "compile_ms",
            "tokens",
            "forward_passes",
            "tokens_jumped",
            "mask_ms_per_pass",
        ):
            assert key in m
        assert (
            case["ratios"][name]["decode_tps"]["unconstrained"] > 0
            and case["ratios"][name]["ttft"]["unconstrained"] > 0
        )
    assert case["median"]["no_jump_forward"]["tokens_jumped"] == 0


def test_check_schema_prints_the_report(tiny_model_dir, capsys):
    schema = '{"type": "array", "items": {"type": "string", "format": "iri"}, "uniqueItems": true}'
    assert main(["check-schema", schema, "--model", str(tiny_model_dir)]) == 0
    out = capsys.readouterr().out
    assert "uniqueItems  validate-and-rollback" in out.replace("  ", "  ") and "/items/format" in out
    for layout in (["--whitespace", "compact"], ["--any-whitespace"]):  # the same report under every layout
        assert main(["check-schema", schema, "--model", str(tiny_model_dir), *layout]) == 0
        assert capsys.readouterr().out.splitlines()[1:] == out.splitlines()[1:]  # the first says the compile time
    assert main(["check-schema", schema, "--model", str(tiny_model_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    hows = {(k["keyword"], k["pointer"]): k["how"] for k in report["keywords"]}
    assert hows == {
        ("type", "/type"): "grammar",
        ("items", "/items"): "grammar",
        ("type", "/items/type"): "grammar",
        ("format", "/items/format"): "validate-and-rollback",
        ("uniqueItems", "/uniqueItems"): "validate-and-rollback",
    }


def test_generate_with_tools_prints_the_calls(tiny_model_dir, tmp_path, capsys):
    """`--tools FILE --tool-choice NAME`: exactly one call of that function, one JSON line on stdout
    whose arguments validate against its parameters; bad tool flags fail before the model loads."""
    import jsonschema

    parameters = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "toggle", "parameters": parameters}}]))
    code = main(
        ["generate", str(tiny_model_dir), "--prompt", "Turn it on.", "--tools", str(tools)]
        + ["--tool-choice", "toggle", "--max-tokens", "40"]
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1
    call = json.loads(out[0])
    assert call["name"] == "toggle"
    jsonschema.validate(call["arguments"], parameters)
    for bad in (["--regex", "a+"], []):
        path = tools if bad else tmp_path / "missing.json"
        code = main(["generate", "no-such-model", "--prompt", "x", "--tools", str(path), *bad])
        assert code != 0 and "--tools" in capsys.readouterr().err
    # Tool flags without --tools would be a constraint silently dropped.
    for flags in (["--tool-choice", "required"], ["--tool-choice", "banana"], ["--no-parallel-tool-calls"]):
        code = main(["generate", "no-such-model", "--prompt", "x", *flags])
        assert code != 0 and "need --tools" in capsys.readouterr().err, flags


def test_generate_refusals_name_the_flag(tiny_model_dir, tmp_path, capsys):
    """The CLI fills the one request (`coreai.service.request`) with its own names: a refused tool choice or
    tool definition names the flag at fault, one line, no traceback."""
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]))
    code = main(["generate", str(tiny_model_dir), "--prompt", "x", "--tools", str(tools), "--tool-choice", "nope"])
    err = capsys.readouterr().err
    assert code == 1 and "error: --tool-choice: " in err and "'nope'" in err and "Traceback" not in err
    bad_parameters = {"type": "object", "properties": {"n": {"type": "integer", "minimum": "a"}}}
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "f", "parameters": bad_parameters}}]))
    code = main(["generate", str(tiny_model_dir), "--prompt", "x", "--tools", str(tools)])
    err = capsys.readouterr().err
    assert code == 1 and "error: --tools[0].function.parameters: tool 'f'" in err


def test_generate_with_tools_keeps_the_complete_calls_when_max_tokens_cuts_one(tiny_model_dir, tmp_path, capsys):
    """Parallel calls cut by --max-tokens: the complete calls are printed and the cut one dropped,
    as the server does (with finish_reason length), not the raw markup as invalid output."""
    parameters = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "toggle", "parameters": parameters}}]))
    code = main(
        ["generate", str(tiny_model_dir), "--prompt", "Turn it on.", "--tools", str(tools), "--tool-choice"]
        + ["required", "--max-tokens", "32", "--temperature", "1", "--seed", "6"]
    )
    captured = capsys.readouterr()
    # Seed 6 writes two calls (46 tokens in all, mostly jump-forward): the budget cuts the second.
    out = captured.out.strip().splitlines()
    assert code == 0 and len(out) == 1 and all(json.loads(line)["name"] == "toggle" for line in out), captured
    assert "cut by --max-tokens" in captured.err and "<tool_call>" not in captured.out


def test_generate_with_tools_and_schema_answers_in_the_schema(tiny_model_dir, tmp_path, capsys):
    """`--tools` with `--schema`: the schema constrains the text answer (as the library and the
    server do); under `--tool-choice none` the answer is the only branch, printed as JSON."""
    import jsonschema

    tools = tmp_path / "tools.json"
    toggle = {"name": "toggle", "parameters": {"type": "object"}}
    tools.write_text(json.dumps([{"type": "function", "function": toggle}]))
    schema = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}
    schema["additionalProperties"] = False
    code = main(
        ["generate", str(tiny_model_dir), "--prompt", "Is it on?", "--tools", str(tools), "--tool-choice", "none"]
        + ["--schema", json.dumps(schema), "--whitespace", "compact", "--max-tokens", "40", "--temperature", "0"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured
    jsonschema.validate(json.loads(captured.out.strip()), schema)


def test_generate_with_a_custom_tool_prints_its_raw_input(tiny_model_dir, tmp_path, capsys):
    """A custom tool (#37) in --tools, chosen by name: one JSON line {name, input} whose raw input
    matches the tool's regex (checked by Python's `re`, not by the code under test)."""
    import re

    date = r"\d{4}-\d{2}-\d{2}"
    tools = tmp_path / "tools.json"
    custom = {"type": "custom", "name": "date", "format": {"type": "grammar", "syntax": "regex", "definition": date}}
    tools.write_text(json.dumps([custom, {"type": "function", "function": {"name": "f", "parameters": {}}}]))
    code = main(
        ["generate", str(tiny_model_dir), "--prompt", "When?", "--tools", str(tools), "--tool-choice", "date"]
        + ["--max-tokens", "40", "--temperature", "0"]
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1, out
    call = json.loads(out[0])
    assert call["name"] == "date" and set(call) == {"name", "input"} and re.fullmatch(date, call["input"]), call
