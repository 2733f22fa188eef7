"""The one prompt pipeline of a guided generation: every front end (the Python API, the CLI, chat
completions, Responses) renders its prompt here, in one fixed order:

1. roles: a `developer` message is a `system` message (chat templates know only `system`);
2. the tool prompt: what the tool format's template needs (`ToolConstraint.prompt`: the generic
   format's system message, Phi-4-mini's system `tools` field);
3. the schema description (`schema_in_prompt`): the JSON output's form in words at the start of the
   system message (`guided.schema_prompt`), the whole schema beside tools;
4. the chat template (`Model.prompt_ids`), with the format's template tools;
5. the reasoning plan (`runtime.reasoning.plan_reasoning`) of the rendered ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from guided.schema_prompt import describe_schema, with_schema_description
from runtime.reasoning import ReasoningPlan, plan_reasoning


@dataclass(frozen=True)
class RenderedPrompt:
    """ids: the prompt's token ids; reasoning: the plan of a thinking model's reasoning block (None
    when the model does not think, the template variables turn it off, or the prompt closed it)."""

    ids: list[int]
    reasoning: ReasoningPlan | None


def as_system(prompt):
    """`prompt` with `developer` messages as `system` ones; other prompts unchanged."""
    if not isinstance(prompt, (list, tuple)) or not all(isinstance(m, dict) for m in prompt):
        return prompt
    return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in prompt]


def describe_in_prompt(
    session, prompt, chat_template: bool = True, schema_in_prompt: bool | None = None, budget: int | None = None
):
    """`prompt` with the JSON output's description (step 3) when `schema_in_prompt` (None: the
    session's setting) says so and the session's output is JSON; chat messages or text (which becomes
    a user message) get it at the start of their system message, text without a chat template as a
    first paragraph; token ids are unchanged. budget: the description's tokens at most (None: the
    session's `schema_hint_budget`; see `guided.schema_prompt.describe_schema`)."""
    if session is None or session.json_spec is None:  # nothing to describe (front ends refuse asking for it)
        return prompt
    wanted = session.schema_in_prompt if schema_in_prompt is None else schema_in_prompt
    if not wanted or not prompt or not isinstance(prompt, (str, list, tuple)):
        return prompt
    schema = session.json_spec.schema if session.json_spec.schema is not None else {"type": "object"}
    style = "schema" if session.tools is not None else None  # beside tools: call or answer, so the whole shape
    budget = session.schema_hint_budget if budget is None else budget
    tokenizer = session.model.tokenizer

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    if isinstance(prompt, str) and not (chat_template and tokenizer.has_chat_template):
        return f"{describe_schema(schema, style, budget, count)}\n\n{prompt}"
    if isinstance(prompt, str) or all(isinstance(m, dict) for m in prompt):
        return with_schema_description(prompt, schema, style, budget, count)
    return prompt  # token ids: the caller rendered the prompt


def render_prompt(
    model,
    session,
    prompt,
    *,
    chat_template: bool = True,
    tools: list[dict] | None = None,
    chat_template_kwargs: dict | None = None,
    schema_in_prompt: bool | None = None,
    schema_hint_budget: int | None = None,
    max_reasoning_tokens: int | None = None,
) -> RenderedPrompt:
    """Render `prompt` (text, chat messages or token ids) for a generation on `model` under `session`
    (a `ConstrainedSession`, or None for free text) in the module's order.

    tools: the template's tools (None: under a tools session, the format's `template_tools`).
    schema_in_prompt: None for the session's setting (`guided.schema_prompt.SCHEMA_IN_PROMPT` by
    default); schema_hint_budget: the description's tokens at most (None: the session's).
    max_reasoning_tokens: the reasoning budget (None: the session's, else 1024). Raises ValueError
    for a bad prompt or a template that cannot render it (jinja2's TemplateError too)."""
    prompt = as_system(prompt)
    if session is not None and session.tools is not None:
        tools = session.tools.template_tools if tools is None else tools
        prompt = session.tools.prompt(prompt)
    prompt = describe_in_prompt(session, prompt, chat_template, schema_in_prompt, schema_hint_budget)
    ids = model.prompt_ids(prompt, chat_template=chat_template, tools=tools, chat_template_kwargs=chat_template_kwargs)
    markers = session.reasoning_tokens if session is not None else model.tokenizer.reasoning_tokens
    if max_reasoning_tokens is None:
        max_reasoning_tokens = session.max_reasoning_tokens if session is not None else 1024
    return RenderedPrompt(ids, plan_reasoning(markers, ids, chat_template_kwargs, max_reasoning_tokens))
