"""Each agent CLI's configuration for a `coreai serve` (`coreai launch`, the agent tests, the task benchmark).

`setup(cli, target, folder)` gives a `Setup`: the environment to set and unset and the files to write,
all in a folder of coreai's own (never the user's own config files):

- Claude Code: environment only. `ANTHROPIC_BASE_URL`, a bearer token (`ANTHROPIC_AUTH_TOKEN`: no
  "use this API key?" question), every model slot (main, small/fast, opus/sonnet/haiku defaults,
  sub-agents) on the served model id, the auto-compact window at the model's context, the reply bound
  at the server's, the request timeout sized to a full-context prefill on this machine, no updater or
  telemetry (the CLI's non-essential traffic off).
- Codex: `CODEX_HOME` set to the folder, whose config.toml names the server as a model provider
  (`wire_api = "responses"`, WebSocket transport) and a model catalog (`model_catalog_json`, Codex's
  `ModelInfo`) describing the served model: its context window, the shell tool, the freeform
  `apply_patch` tool and short instructions, so Codex no longer falls back to "fallback metadata".
- opencode: `OPENCODE_CONFIG` pointing at the folder's opencode.json (merged over the user's own
  config, which is not touched): a provider through `@ai-sdk/openai-compatible` with the server's
  base URL and the model's limits (context, and output at the server's bound: a larger `max_tokens`
  is refused by chat completions), its timeouts sized as above.

`short=True` adds each CLI's own options for a shorter prompt and fewer tools (a CPU prefills Claude
Code's full prompt, ~20k tokens, in minutes).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from coreai.errors import InputError

CLIS = ("claude", "codex", "opencode")
KEY_ENV = "COREAI_LAUNCH_KEY"  # Codex's provider reads its key from this variable
DEFAULT_CONTEXT = 32768  # when the model's config cannot be read

# Prompt tokens a second of prefill, assumed (not measured at launch): on a CPU ~20 per core (Claude
# Code's 19.8k-token prompt took 456 s on 2 cores: docs/reports/claude-code.md); Apple silicon's GPU
# is taken as 400.
PREFILL_PER_CORE = 20.0
PREFILL_METAL = 400.0

# The instructions of the served model in Codex's catalog (Codex's own are GPT-5's, ~20 KB), and of
# the short set-ups: what a small model needs to call the tools before answering.
INSTRUCTIONS = (
    "You are a coding agent working in the user's workspace. You cannot see the files: read them with the "
    "shell tool (cat FILE) before answering, change them with the edit tools, run commands to check your "
    "work, then answer briefly."
)
# The short set-ups' instructions name each CLI's own tools, after the line the served model was
# trained with as its system prompt (its chat template's default, which a client's system prompt
# replaces): with both, the default model called the tool it was asked to in 5 of 5 runs, and
# answered without reading in 4 of 4 with a generic line (tests/test_agent_cli.py, 2026-12-06).
MODEL_LINES = (("qwen2.5", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),)
SHORT_TOOLS = {
    "claude": "read a file with the Read tool before answering about it, run commands with the Bash tool, change "
    "a file with the Edit tool and create one with the Write tool",
    "codex": "read a file with the exec_command tool (cmd: cat FILE) before answering about it, run commands "
    "with exec_command, change or create files with apply_patch",
    "opencode": "read a file with the read tool before answering about it, run commands with the bash tool, "
    "change a file with the edit tool and create one with the write tool",
}


def short_instructions(cli: str, model: str) -> str:
    """The short set-up's system prompt for `cli` serving `model` (see `MODEL_LINES`)."""
    line = next((text for prefix, text in MODEL_LINES if prefix in model.lower()), "")
    tools = f"You cannot see the user's files: {SHORT_TOOLS[cli]}. Then answer briefly, from what the tools showed."
    return f"{line} {tools}".strip()


# The ids Claude Code is given when the server takes them (`--alias 'claude-*'`): with another id it
# first sends the environment as a `system` message inside `messages`, which the Messages API
# refuses (a 400 it then retries without), and its prompt names the served model.
CLAUDE_MODEL = "claude-sonnet-4-5"
CLAUDE_SMALL_MODEL = "claude-haiku-4-5"
CLAUDE_SHORT_TOOLS = "Bash,Read,Edit,Write,Glob,Grep"
OPENCODE_SHORT_OFF = ("webfetch", "websearch", "todowrite", "todoread", "task", "skill", "question", "codesearch")

# Codex's own configuration for a short prompt: the permissions, environment, skills, apps and
# collaboration sections, the sub-agent, goal, plugin, image and web-search tools off, and
# `request_user_input` (offered by `codex exec`, which then refuses it); `exec_command` / the shell,
# `write_stdin` and (from the catalog) `apply_patch` stay.
CODEX_SHORT = """model_instructions_file = "{instructions}"
web_search = "disabled"
include_environment_context = false
include_permissions_instructions = false
include_apps_instructions = false
include_collaboration_mode_instructions = false
[skills]
include_instructions = false
[agents]
enabled = false
[features]
goals = false
apps = false
plugins = false
view_image = false
tool_suggest = false
sleep_tool = false
[tools]
experimental_request_user_input = {{ enabled = false }}
"""


@dataclass(frozen=True)
class Target:
    """The server a CLI is pointed at: `base_url` (http://HOST:PORT, no /v1), the served `model` id,
    its `context_window` and the server's reply bound `max_tokens` (tokens), the API key (None: the
    server takes none) and the client's request `timeout` (seconds)."""

    base_url: str
    model: str
    context_window: int = DEFAULT_CONTEXT
    max_tokens: int = 1024
    api_key: str | None = None
    timeout: int = 600


@dataclass
class Setup:
    """A CLI's configuration: `env` to set, `unset` to remove, `files` to write (path -> text),
    `args` to put before the user's own CLI arguments."""

    cli: str
    target: Target
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    files: dict[Path, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)

    def write(self) -> None:
        """Write `files` (their folders made)."""
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) without `unset`, with `env`."""
        out = dict(os.environ if base is None else base)
        for name in self.unset:
            out.pop(name, None)
        return out | self.env

    def describe(self, program: str) -> str:
        """The configuration as a shell user would apply it: the files (written), the variables, the command."""
        t = self.target
        lines = [
            f"# {self.cli} against coreai serve at {t.base_url}: model {t.model}, context {t.context_window} "
            f"tokens, replies up to {t.max_tokens} tokens, request timeout {t.timeout} s"
        ]
        for path, text in self.files.items():
            lines += [f"# file {path} (written):", *(f"#   {line}" for line in text.splitlines())]
        lines += [f"unset {name}" for name in self.unset]
        lines += [f"export {name}={shlex.quote(value)}" for name, value in self.env.items()]
        lines.append(shlex.join([program, *self.args]))
        return "\n".join(lines) + "\n"


def prefill_rate() -> float:
    """Prompt tokens a second this machine is assumed to prefill (`PREFILL_PER_CORE`, `PREFILL_METAL`)."""
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return PREFILL_METAL
    return PREFILL_PER_CORE * (os.cpu_count() or 1)


def request_timeout(context_window: int) -> int:
    """Seconds a client should wait on one request: twice a full context's prefill at `prefill_rate`,
    at least 10 minutes and at most 4 hours."""
    return int(min(4 * 3600, max(600, 2 * context_window / prefill_rate())))


def context_window(*models: str | None) -> int:
    """The context (tokens) of the first of `models` (a registry name whose export exists, or an MLX
    folder) whose config.json says it (`max_position_embeddings`, also under `text_config`); else
    `DEFAULT_CONTEXT`. Exports nothing."""
    from coreai import store

    for model in models:
        if not model:
            continue
        folder = store.model_dir(model) if model in store.REGISTRY else Path(model).expanduser()
        try:
            config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            continue
        for section in (config, config.get("text_config") or {}):
            if isinstance(section.get("max_position_embeddings"), int):
                return section["max_position_embeddings"]
    return DEFAULT_CONTEXT


def takes_claude_ids(aliases) -> bool:
    """Whether a server with these aliases (its /health `aliases`) serves `CLAUDE_MODEL` and `CLAUDE_SMALL_MODEL`."""
    import fnmatch

    names = [a.split("=", 1)[0] for a in aliases or ()]
    return all(any(fnmatch.fnmatchcase(m, n) for n in names) for m in (CLAUDE_MODEL, CLAUDE_SMALL_MODEL))


def setup(cli: str, target: Target, folder: Path, short: bool = False, claude_ids: bool = False) -> Setup:
    """The configuration of `cli` (one of `CLIS`) for `target`, its files in `folder` (not written:
    `Setup.write`); `claude_ids`: Claude Code sends Claude's ids (`takes_claude_ids`). Raises
    InputError for another CLI."""
    if cli == "claude" and claude_ids:
        return claude(target, short=short, model=CLAUDE_MODEL, small_model=CLAUDE_SMALL_MODEL)
    if cli == "claude":
        return claude(target, short=short)
    if cli == "codex":
        return codex(target, folder, short=short)
    if cli == "opencode":
        return opencode(target, folder, short=short)
    raise InputError(f"unknown agent CLI {cli!r}: one of {', '.join(CLIS)}")


def claude(target: Target, short: bool = False, model: str | None = None, small_model: str | None = None) -> Setup:
    """Claude Code: environment only (see the module docstring); `model` / `small_model`: the ids it
    sends (default: the served model; Claude ids need the server's `--alias 'claude-*'`)."""
    main, small = model or target.model, small_model or model or target.model
    env = {
        "ANTHROPIC_BASE_URL": target.base_url,
        "ANTHROPIC_AUTH_TOKEN": target.api_key or "unused",
        "ANTHROPIC_MODEL": main,
        "ANTHROPIC_SMALL_FAST_MODEL": small,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": main,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": main,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": small,
        "CLAUDE_CODE_SUBAGENT_MODEL": main,
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(target.context_window),  # an unknown model's window
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(target.context_window),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(target.max_tokens),
        "API_TIMEOUT_MS": str(target.timeout * 1000),
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    unset = (
        "ANTHROPIC_API_KEY",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "CLAUDE_CODE_USE_BEDROCK",
        "CLAUDE_CODE_USE_VERTEX",
        "CLAUDE_CODE_USE_FOUNDRY",
    )
    args = (
        ["--system-prompt", short_instructions("claude", target.model), "--tools", CLAUDE_SHORT_TOOLS] if short else []
    )
    return Setup("claude", target, env, unset, {}, args)


def codex_catalog(model: str, context: int, instructions: str = INSTRUCTIONS) -> dict:
    """A Codex model catalog (`model_catalog_json`: a list of Codex's `ModelInfo`) naming `model`:
    Codex then knows its context window (no "Model metadata ... not found" warning), runs shell
    commands through `shell_command` and offers its freeform `apply_patch` (a custom tool with a Lark
    grammar, which the server enforces)."""
    info = {
        "slug": model,
        "display_name": model,
        "description": "served by coreai serve",
        "supported_reasoning_levels": [],
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 1,
        "upgrade": None,
        "base_instructions": instructions,
        "supports_reasoning_summaries": False,
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "truncation_policy": {"mode": "bytes", "limit": 10000},
        "supports_parallel_tool_calls": False,
        "context_window": context,
        "experimental_supported_tools": [],
    }
    return {"models": [info]}


def codex_config(target: Target, catalog: Path | None, websockets: bool = True, extra: str = "") -> str:
    """Codex's config.toml naming the server as its model provider `coreai` (its key in `KEY_ENV`);
    `catalog`: the model catalog's path (None: none, Codex's fallback metadata); `extra`: more
    top-level lines."""
    timeout_ms = target.timeout * 1000
    head = f'model = "{target.model}"\nmodel_provider = "coreai"\ncheck_for_update_on_startup = false\n'
    if catalog is not None:
        head += f"model_catalog_json = {json.dumps(str(catalog))}\n"
    return (
        f"{head}{extra}\n"
        "[model_providers.coreai]\n"
        'name = "coreai"\n'
        f'base_url = "{target.base_url}/v1"\n'
        'wire_api = "responses"\n'
        f'env_key = "{KEY_ENV}"\n'
        f"supports_websockets = {'true' if websockets else 'false'}\n"
        # The stream sends `response.in_progress` every 15 s while a prefill runs; the bound is the
        # request's whole prefill all the same.
        f"stream_idle_timeout_ms = {timeout_ms}\n"
    )


def codex(target: Target, folder: Path, short: bool = False, websockets: bool = True, extra: str = "") -> Setup:
    """Codex: `CODEX_HOME` = `folder`, its config.toml and model catalog (see the module docstring)."""
    catalog = folder / "catalog.json"
    files = {catalog: json.dumps(codex_catalog(target.model, target.context_window), indent=2) + "\n"}
    if short:
        instructions = folder / "instructions.md"
        files[instructions] = short_instructions("codex", target.model) + "\n"
        extra = CODEX_SHORT.format(instructions=instructions) + extra
    files[folder / "config.toml"] = codex_config(target, catalog, websockets, extra)
    env = {"CODEX_HOME": str(folder), KEY_ENV: target.api_key or "unused"}
    return Setup("codex", target, env, ("OPENAI_BASE_URL",), files, [])


def opencode_config(target: Target, short: bool = False) -> dict:
    """opencode's configuration: the provider `coreai` (`@ai-sdk/openai-compatible`) and its model."""
    timeout_ms = target.timeout * 1000
    model = {
        "name": target.model,
        "tool_call": True,
        "temperature": True,
        "limit": {"context": target.context_window, "output": target.max_tokens},
    }
    options = {
        "baseURL": f"{target.base_url}/v1",
        "apiKey": target.api_key or "unused",
        "includeUsage": True,
        "timeout": timeout_ms,
        "headerTimeout": timeout_ms,
        "chunkTimeout": timeout_ms,
    }
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "coreai serve", "options": options}
    config: dict = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"coreai": provider | {"models": {target.model: model}}},
        "model": f"coreai/{target.model}",
        "small_model": f"coreai/{target.model}",
        "autoupdate": False,
        "share": "disabled",
    }
    if short:
        config["tools"] = {name: False for name in OPENCODE_SHORT_OFF}
        config["agent"] = {"build": {"prompt": short_instructions("opencode", target.model)}}
    return config


def opencode(target: Target, folder: Path, short: bool = False) -> Setup:
    """opencode: `OPENCODE_CONFIG` = `folder`/opencode.json (see the module docstring)."""
    path = folder / "opencode.json"
    files = {path: json.dumps(opencode_config(target, short), indent=2) + "\n"}
    env = {"OPENCODE_CONFIG": str(path), "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"}
    return Setup("opencode", target, env, ("OPENCODE_CONFIG_CONTENT",), files, [])
