"""`coreai generate MODEL (--prompt TEXT | --messages FILE) [sampling options] [grammar options]
[--tools FILE [--tool-choice C] [--no-parallel-tool-calls]]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from coreai.commands import common
from runtime.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text (optionally constrained by a schema or grammar)")
    p.add_argument(
        "model", nargs="?", default=None, help="registry name, MLX folder or repo id (default: the embedded model)"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt (a user message when the model has a chat template)")
    src.add_argument("--messages", type=Path, help="JSON file with a list of chat messages")
    p.add_argument("--no-chat-template", action="store_true", help="send --prompt as plain text")
    p.add_argument(
        "--no-thinking",
        action="store_true",
        help="thinking models: pass enable_thinking=false to the chat template (no reasoning block)",
    )
    p.add_argument("--stream", action="store_true", help="print text as it is generated")
    common.add_sampling_args(p)
    common.add_model_args(p)
    common.add_distributed_args(p)
    common.add_grammar_args(p)
    common.add_speculative_arg(p)
    p.add_argument("--tools", type=Path, help="JSON file with a list of tools (OpenAI function definitions)")
    p.add_argument(
        "--tool-choice",
        help="with --tools: auto (default), required, none, or a function name (exactly one call of it)",
    )
    p.add_argument("--no-parallel-tool-calls", action="store_true", help="with --tools: at most one call")
    p.add_argument("-v", "--verbose", action="store_true", help="also print forward passes and draft acceptance")
    p.set_defaults(func=run)


def run(args) -> int:
    sampling = common.sampling_params(args)  # checks every sampling flag before the (slow) model load
    common.check_grammar_args(args)
    prompt = args.prompt if args.prompt is not None else common.read_messages(args.messages)
    if args.tools is None and (args.tool_choice is not None or args.no_parallel_tool_calls):
        raise InputError("--tool-choice and --no-parallel-tool-calls need --tools FILE")
    tools = read_tools(args) if args.tools is not None else None
    model = common.load_model(args, common.cluster(args))
    if common.follows(model):
        return common.follow(model)
    try:
        return generate(model, args, sampling, prompt, tools)
    finally:
        if model.leader is not None:  # the other ranks wait for rank 0's word that it is done
            model.leader.close()


def generate(model, args, sampling, prompt, tools) -> int:
    """Generate, print the output and the figures; the exit code."""
    from guided import free_outcome

    session = common.constrained_session(model, args) if tools is None else tools_session(model, tools, args)
    kwargs = dict(
        max_tokens=args.max_tokens,
        sampling=sampling,
        stop=args.stop or None,
        chat_template=not args.no_chat_template,
        speculative=args.speculative,
        chat_template_kwargs={"enable_thinking": False} if args.no_thinking else None,
    )
    runner = session if session is not None else model
    if args.stream:
        result = None
        for delta in runner.stream(prompt, **kwargs):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            result = delta.result or result
        sys.stdout.write("\n")
        assert result is not None  # the last delta carries the result
    else:
        result = runner.generate(prompt, **kwargs)
    # What the result means is decided once (`guided.outcome`); the CLI renders it, as the server does.
    outcome = result.outcome if session is not None else free_outcome(result)
    # Beside complete calls, an output cut by --max-tokens is those calls (the cut one is dropped).
    cut_after_calls = outcome.finish == "length" and bool(outcome.tool_calls)
    usable = session is None or result.valid or cut_after_calls
    if not args.stream:
        if outcome.reasoning:
            print(f"[reasoning] {outcome.reasoning}", file=sys.stderr)
        if cut_after_calls:
            print("coreai generate: a call cut by --max-tokens was dropped", file=sys.stderr)
        if not usable:  # stdout carries only valid output (e.g. into a pipe)
            print(f"coreai generate: partial output, not valid: {result.text}", file=sys.stderr)
        elif tools is not None:  # one JSON line per call, then the text answer, if any
            for call in outcome.tool_calls:
                print(json.dumps({"name": call.name, "arguments": call.args}, ensure_ascii=False))
            if outcome.content:
                print(outcome.content)
        else:
            print(outcome.content)
    common.print_stats(result, outcome.finish, args.verbose)
    if session is not None and args.verbose:
        common.print_enforcement(session, result)
    if not usable:
        print(f"coreai generate: invalid output: {'; '.join(result.errors)}", file=sys.stderr)
        return 1
    return 1 if outcome.finish == "error" else 0


def read_tools(args) -> list:
    """The --tools file's list of tools; ValueError (before the model loads) for a bad file or flags
    that do not go with tools."""
    if any(getattr(args, k) for k in ("regex", "choice", "grammar")):
        raise InputError("--tools cannot be combined with --regex, --choice or --grammar (--schema can)")
    try:
        tools = json.loads(args.tools.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"--tools {args.tools}: {exc}") from None
    if not isinstance(tools, list) or not tools:
        raise InputError(f"--tools {args.tools}: expected a non-empty JSON list of tools")
    return tools


def tools_session(model, tools: list, args):
    """The `ConstrainedSession` of --tools: `--tool-choice` auto / required / none or a function name;
    `--schema` / `--json-object` constrain the text answer beside the calls."""
    from guided import ConstrainedSession

    choice = args.tool_choice or "auto"
    if choice not in ("auto", "required", "none"):
        choice = {"type": "function", "function": {"name": choice}}
    return ConstrainedSession(
        model,
        tools=tools,
        tool_choice=choice,
        schema=args.schema or None,
        json_object=bool(args.json_object),
        parallel_tool_calls=not args.no_parallel_tool_calls,
        **common.session_options(args),
    )
