"""`coreai launch claude|codex|opencode` (issue #59) on the tiny network that ends its turn at once
(conftest's `ending_model_dir`): the model writes nothing useful, so what is checked is the plumbing.

- `--print`: the configuration each CLI gets (environment, files), for the server it would start;
  nothing is started.
- each real CLI (node_modules/.bin, pinned in package.json) run by `coreai launch` against a server
  already answering, behind a recorder: the CLI's requests reach the server on its dialect's route
  with the served model id, every one answered 200, and the CLI exits 0.
- launch starting `coreai serve` itself (Codex, the quickest CLI here): the turn completes and the
  server is stopped when the CLI exits.
- a missing CLI, a port taken by something else, a server serving another model: one line, exit 1.

A missing CLI is a failure, never a skip: `make install` installs them.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest
from agent_cli import Recorder

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai import cli
from coreai.commands import launch
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 131072  # the ending network's max_position_embeddings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def printed(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["launch", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def exports(out: str) -> dict[str, str]:
    """The `export NAME=VALUE` lines of --print (values unquoted by a shell's rules)."""
    import shlex

    lines = [line[len("export ") :] for line in out.splitlines() if line.startswith("export ")]
    return dict(shlex.split(line)[0].split("=", 1) for line in lines)


# ---- --print --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["claude", "codex", "opencode"])
def test_print_shows_the_configuration_and_starts_nothing(name, ending_model_dir, tmp_path, capsys):
    port = free_port()
    model = ending_model_dir.name  # the name a started `coreai serve FOLDER` serves
    argv = (name, "--print", "--port", str(port), "--model", str(ending_model_dir), "--config-dir", str(tmp_path))
    code, out, err = printed(capsys, *argv)
    assert code == 0, err
    base = f"http://127.0.0.1:{port}"
    assert f"# coreai serve at {base}: not running" in out
    env = exports(out)
    if name == "claude":  # the server launch starts takes Claude's ids (`--alias 'claude-*'`)
        assert env["ANTHROPIC_BASE_URL"] == base and env["ANTHROPIC_MODEL"] == "claude-sonnet-4-5"
        assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "claude-haiku-4-5"
        assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(CONTEXT) and env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "1024"
        assert int(env["API_TIMEOUT_MS"]) >= 600_000
        assert "unset ANTHROPIC_API_KEY" in out and "# file" not in out  # environment only
    elif name == "codex":
        home = Path(env["CODEX_HOME"])
        config = tomllib.loads((home / "config.toml").read_text())
        assert (config["model"], config["model_provider"]) == (model, "coreai")
        provider = config["model_providers"]["coreai"]
        assert provider["base_url"] == f"{base}/v1" and provider["wire_api"] == "responses"
        assert env[provider["env_key"]] == "unused"
        [info] = json.loads(Path(config["model_catalog_json"]).read_text())["models"]
        assert (info["slug"], info["context_window"], info["apply_patch_tool_type"]) == (model, CONTEXT, "freeform")
        assert f"# file {home / 'config.toml'} (written):" in out
    else:
        config = json.loads(Path(env["OPENCODE_CONFIG"]).read_text())
        provider = config["provider"]["coreai"]
        assert provider["npm"] == "@ai-sdk/openai-compatible" and provider["options"]["baseURL"] == f"{base}/v1"
        assert provider["models"][model]["limit"] == {"context": CONTEXT, "output": 1024}
        assert config["model"] == f"coreai/{model}"
    assert out.rstrip().splitlines()[-1] == name  # the command to run
    assert not listening(port)  # nothing was started


def test_print_short_gives_claude_code_its_own_flags(ending_model_dir, capsys):
    code, out, _ = printed(capsys, "claude", "--print", "--short", "--port", str(free_port()))
    assert code == 0
    assert out.rstrip().splitlines()[-1].startswith("claude --system-prompt ") and "--tools Bash,Read" in out


def test_the_short_instructions_name_each_cli_s_tools_after_the_model_s_own_line():
    from coreai.commands import agent_config

    qwen = agent_config.short_instructions("opencode", "qwen2.5-coder-0.5b-instruct")
    assert qwen.startswith("You are Qwen, created by Alibaba Cloud.") and "the read tool" in qwen
    assert "the Read tool" in agent_config.short_instructions("claude", "qwen2.5-coder-1.5b-instruct")
    assert "exec_command" in agent_config.short_instructions("codex", "Qwen2.5-7B")
    other = agent_config.short_instructions("claude", "tiny")
    assert other.startswith("You cannot see the user's files") and "Qwen" not in other


def test_a_running_server_s_reply_bound_is_the_one_the_cli_gets(running, capsys):
    """/health says the server's --max-tokens; launch configures the CLI with it, not its own."""
    _, port = running
    body = launch.health(f"http://127.0.0.1:{port}", None)
    assert body["max_tokens"] == 1024  # the fixture's server: the default bound
    args = cli.build_parser().parse_args(["launch", "opencode", "--port", str(port), "--max-tokens", "4096"])
    assert launch.target_of(args, {**body, "max_tokens": 512}, None).max_tokens == 512
    assert launch.target_of(args, {"model": "tiny"}, None).max_tokens == 4096  # an older server says none


# ---- errors -----------------------------------------------------------------------------------------


def test_a_missing_cli_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(launch, "ROOT", tmp_path)  # no node_modules here
    monkeypatch.setenv("PATH", str(tmp_path))
    port = free_port()
    code, out, err = printed(capsys, "opencode", "--port", str(port))
    assert code == 1 and out == ""
    assert "the opencode CLI is not installed" in err and "make install" in err and "npm install -g opencode-ai" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not listening(port)  # checked before any server starts


def test_a_port_taken_by_something_else_is_a_clear_error(capsys):
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        code, _, err = printed(capsys, "codex", "--print", "--port", str(other.server_port))
    finally:
        other.shutdown()
    assert code == 1 and "answers /health with HTTP 404: not coreai serve" in err and "Traceback" not in err


def test_a_server_answering_late_is_waited_for_not_replaced(monkeypatch):
    """A server busy with a long request answers /health late: launch asks again with a longer
    timeout, and one that never answers is a clear error, never a second server on a taken port
    (seen: launch started `coreai serve`, which could not bind)."""
    delay = {"seconds": 0.6}

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            import time

            time.sleep(delay["seconds"])
            body = json.dumps({"model": "slow", "aliases": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    slow = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    slow.handle_error = lambda *args: None  # the reply to a client that gave up: a broken pipe
    threading.Thread(target=slow.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{slow.server_port}"
    try:
        monkeypatch.setattr(launch, "HEALTH_TIMEOUTS", (0.2, 5.0))
        assert launch.health(base, None)["model"] == "slow"
        delay["seconds"] = 2.0
        monkeypatch.setattr(launch, "HEALTH_TIMEOUTS", (0.2, 0.3))
        with pytest.raises(launch.InputError, match=r"takes connections but /health did not answer within 0 s"):
            launch.health(base, None)
    finally:
        slow.shutdown()
    assert launch.health(f"http://127.0.0.1:{free_port()}", None) is None  # nothing listens


# ---- the real CLIs against a server already running -------------------------------------------------


@pytest.fixture(scope="module")
def running(ending_model_dir):
    """The ending network served in this process as `tiny` (and Claude's ids), behind a recorder:
    (recorder, its port)."""
    from runtime import load_model

    # The default bound, 1,024 tokens: launch's default.
    config = ServerConfig(model_name="tiny", aliases=("claude-*",), temperature=0.0)
    with serve_in_thread(load_model(ending_model_dir), config) as base:
        recorder = Recorder(upstream=base)
        with recorder.serving() as front:
            yield recorder, int(front.rsplit(":", 1)[1])


def test_a_running_server_with_another_model_is_refused(running, capsys):
    _, port = running
    code, _, err = printed(capsys, "claude", "--print", "--port", str(port), "--model", "other")
    assert code == 1 and "serves tiny, not other" in err


def launched(name: str, port: int, tmp_path: Path, *cli_args: str, launch_args=()) -> subprocess.CompletedProcess:
    """`coreai launch NAME --port PORT ... -- CLI_ARGS` in a fresh workspace with its own HOME."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_", "OPENCODE_"))}
    env |= {"HOME": str(home), "NO_COLOR": "1", "PWD": str(work)}  # opencode's project folder is $PWD
    cmd = [sys.executable, "-m", "coreai", "launch", name, "--port", str(port), "--config-dir", str(tmp_path / "cfg")]
    return subprocess.run(
        [*cmd, *launch_args, "--", *cli_args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


CLI_RUNS = {
    "claude": (("-p", "Say hi.", "--output-format", "json", "--max-turns", "1"), "/v1/messages?beta=true"),
    # Over HTTP (the recorder forwards no WebSocket): the CLI's own -c override, passed through.
    "codex": (
        ("exec", "-c", "model_providers.coreai.supports_websockets=false", "--json", "--skip-git-repo-check", "Hi."),
        "/v1/responses",
    ),
    "opencode": (("run", "--format", "json", "Say hi."), "/v1/chat/completions"),
}


@pytest.mark.parametrize("name", list(CLI_RUNS))
def test_launch_runs_the_cli_against_the_running_server(name, running, tmp_path):
    recorder, port = running
    if not (ROOT / "node_modules" / ".bin" / name).exists():
        pytest.fail(f"node_modules/.bin/{name} is missing: run `make install`", pytrace=False)
    args, route = CLI_RUNS[name]
    before = len(recorder.exchanges)
    done = launched(name, port, tmp_path, *args)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    sent = recorder.exchanges[before:]
    assert (sent[0].method, sent[0].path, sent[0].status) == ("GET", "/health", 200)  # launch found the server
    api = [x for x in sent if x.method == "POST"]
    assert api and {x.path for x in api} == {route}, [(x.method, x.path) for x in sent]
    ids = {"claude-sonnet-4-5", "claude-haiku-4-5"} if name == "claude" else {"tiny"}
    assert {x.body["model"] for x in api} <= ids, {x.body["model"] for x in api}
    assert {x.status for x in api} == {200}, [(x.status, x.reply[:300]) for x in api if x.status != 200]
    if name == "opencode":  # the output bound is the server's, not opencode's 32,000 (a 400 from chat completions)
        assert {x.body["max_tokens"] for x in api} == {1024}, [x.body.get("max_tokens") for x in api]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if name == "claude":
        assert events[-1]["is_error"] is False and set(events[-1]["modelUsage"]) <= ids
    elif name == "codex":
        assert events[-1]["type"] == "turn.completed"
        assert "Model metadata" not in done.stdout + done.stderr  # the catalog describes the model
    else:
        assert events[-1]["type"] == "step_finish" and events[-1]["part"]["reason"] == "stop"


# ---- launch starting the server ---------------------------------------------------------------------


def test_launch_starts_a_server_and_stops_it_when_the_cli_exits(ending_model_dir, tmp_path):
    port = free_port()
    serve = ["--model", str(ending_model_dir), "--prompt-cache-dir", "off", "--serve-arg=--grammar-journal"]
    serve += ["--serve-arg=off"]
    args = ("exec", "--json", "--skip-git-repo-check", "Hi.")
    done = launched("codex", port, tmp_path, *args, launch_args=serve)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "coreai launch: starting coreai serve" in done.stderr
    log = (tmp_path / "cfg" / "serve.log").read_text()
    assert f"coreai serve: {ending_model_dir.name} on http://127.0.0.1:{port}/v1" in log
    turn = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][-1]
    assert turn["type"] == "turn.completed" and turn["usage"]["input_tokens"] > 4000  # Codex's prompt reached the model
    assert not listening(port)  # stopped with the CLI
