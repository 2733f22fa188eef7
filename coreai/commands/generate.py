"""`coreai generate MODEL (--prompt TEXT | --messages FILE) [sampling options] [grammar options]
[--tools FILE [--tool-choice C] [--no-parallel-tool-calls]]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from coreai.commands import common
from runtime.errors import InputError

if TYPE_CHECKING:
    from coreai.service import GenerationRequest


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
    p.add_argument(
        "--tools", type=Path, help="JSON file with a list of tools (OpenAI function or custom tool definitions)"
    )
    p.add_argument(
        "--tool-choice",
        help="with --tools: auto (default), required, none, or a tool's name (exactly one call of it)",
    )
    p.add_argument("--no-parallel-tool-calls", action="store_true", help="with --tools: at most one call")
    p.add_argument("-v", "--verbose", action="store_true", help="also print forward passes and draft acceptance")
    p.set_defaults(func=run)


def request_of(args, prompt, tools: list | None) -> GenerationRequest:
    """The one request (`coreai.service.GenerationRequest`) the flags ask for, its errors naming
    the flags; `prompt`: the text or messages, `tools`: the --tools file's list."""
    from coreai.service import GenerationRequest, Names
    from runtime.sampling import given_sampling

    names = Names(
        messages="--prompt/--messages",
        max_tokens="--max-tokens",
        tools="--tools",
        tool_choice="--tool-choice",
        tool_parameters="--tools[{}].function.parameters",
        tool_format="--tools[{}].format",
        schema_in_prompt="--schema-in-prompt",
    )
    # A tool's name (function or custom) is exactly one call of it: guided reads a bare name so.
    choice = args.tool_choice or "auto"
    return GenerationRequest(
        messages=prompt,
        names=names,
        sampling=given_sampling(args),
        max_tokens=args.max_tokens,
        stop=args.stop or [],
        answer=common.answer_of(args),
        tools=tools,
        tool_choice=choice if tools is not None else None,
        parallel_tool_calls=not args.no_parallel_tool_calls,
        chat_template=not args.no_chat_template,
        chat_template_kwargs={"enable_thinking": False} if args.no_thinking else None,
        schema_in_prompt=args.schema_in_prompt,
        schema_hint_budget=args.schema_hint_budget,
        speculative=args.speculative,
    )


def run(args) -> int:
    common.check_sampling(args)  # every sampling flag before the (slow) model load
    options = common.constraint_options(args)
    prompt = args.prompt if args.prompt is not None else common.read_messages(args.messages)
    if args.tools is None and (args.tool_choice is not None or args.no_parallel_tool_calls):
        raise InputError("--tool-choice and --no-parallel-tool-calls need --tools FILE")
    if args.tools is not None and any(getattr(args, k) for k in ("regex", "choice", "grammar")):
        raise InputError("--tools cannot be combined with --regex, --choice or --grammar (--schema can)")
    request = request_of(args, prompt, read_tools(args) if args.tools is not None else None)
    model = common.load_model(args, common.cluster(args))
    if common.follows(model):
        return common.follow(model)
    try:
        return generate(model, args, options, request)
    finally:
        if model.leader is not None:  # the other ranks wait for rank 0's word that it is done
            model.leader.close()


def generate(model, args, options, request) -> int:
    """Generate `request` (`coreai.service.GenerationRequest`): the job `coreai.service.prepare`
    makes of it, run alone (`coreai.service.run`); print the output and the figures; the exit code."""
    from coreai.service import Settings, decided, prepare
    from coreai.service.run import stream
    from guided import GuidedResult

    job = prepare(model, request, settings=Settings(options=options))
    constraint = job.constraint
    deltas = stream(model, job)
    result = None
    for delta in deltas:
        if args.stream:
            sys.stdout.write(delta.text)
            sys.stdout.flush()
        result = delta.result or result
    if args.stream:
        sys.stdout.write("\n")
    assert result is not None  # the last delta carries the result
    # What the result means is decided once (`guided.outcome`); the CLI renders it, as the server does.
    checked = result if isinstance(result, GuidedResult) else None  # a constrained generation's verdict
    outcome = decided(result, job.reasoning)
    # Beside complete calls, an output cut by --max-tokens is those calls (the cut one is dropped).
    cut_after_calls = outcome.finish == "length" and bool(outcome.tool_calls)
    usable = checked is None or checked.valid or cut_after_calls
    if not args.stream:
        if outcome.reasoning:
            print(f"[reasoning] {outcome.reasoning}", file=sys.stderr)
        if cut_after_calls:
            print("coreai generate: a call cut by --max-tokens was dropped", file=sys.stderr)
        if not usable:  # stdout carries only valid output (e.g. into a pipe)
            print(f"coreai generate: partial output, not valid: {result.text}", file=sys.stderr)
        elif request.tools is not None:  # one JSON line per call, then the text answer, if any
            for call in outcome.tool_calls:  # a custom tool's call: its raw input
                given = {"input": call.input} if call.kind == "custom" else {"arguments": call.args}
                print(json.dumps({"name": call.name, **given}, ensure_ascii=False))
            if outcome.content:
                print(outcome.content)
        else:
            print(outcome.content)
    common.print_stats(result, outcome.finish, args.verbose)
    if constraint is not None and args.verbose:
        common.print_enforcement(outcome, result)
    if checked is not None and not usable:
        print(f"coreai generate: invalid output: {'; '.join(checked.errors)}", file=sys.stderr)
        return 1
    return 1 if outcome.finish == "error" else 0


def read_tools(args) -> list:
    """The --tools file's list of tools; InputError (before the model loads) for a bad file."""
    try:
        tools = json.loads(args.tools.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"--tools {args.tools}: {exc}") from None
    if not isinstance(tools, list) or not tools:
        raise InputError(f"--tools {args.tools}: expected a non-empty JSON list of tools")
    return tools
