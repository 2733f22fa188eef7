"""Turn a request's `response_format`, `structured_outputs` and `tools` into one compiled grammar, and
check the final output against what was asked.

Compiling happens on the request's thread (llguidance only, no MLX), so a bad schema is a 400 before
the request queues; it never falls back to free text. Only one constraint applies per request:
combining a JSON response format with active tools is refused (400) rather than guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coreai.errors import GrammarError, SchemaError
from coreai.server import tools as tool_format
from coreai.server.errors import bad_request, from_library_error
from coreai.server.schemas import ChatCompletionRequest, JsonObjectFormat, JsonSchemaFormat, SamplingFields
from guided import CompiledGrammar, GrammarCache, TokenizerInfo, check_json, default_cache, make_spec


@dataclass
class Constraint:
    """A compiled grammar plus what the final output must satisfy.

    schema: JSON Schema the whole content must validate against (JSON kinds), else None.
    functions: name -> parameter schema, for tool calls (each call's arguments must validate).
    tool_mode: None (no tools), "auto" or "required" (a named function is "required" over one function).
    """

    compiled: CompiledGrammar | None
    schema: object = None
    functions: dict[str, object] = field(default_factory=dict)
    tool_mode: str | None = None

    def content_errors(self, text: str) -> list[str]:
        """Why `text` is not JSON valid against `schema` ([] if it is, or if there is no schema)."""
        return [] if self.schema is None else check_json(text, self.schema)[1]

    def call_errors(self, name: str, arguments: str) -> list[str]:
        """Why a call (`arguments`: JSON text) does not fit the function's parameters ([] if it does)."""
        if name not in self.functions:
            return [f"unknown function {name!r}"]
        return check_json(arguments, self.functions[name])[1]


class Constraints:
    """Builds `Constraint`s for one model. `tokenizer` is None when the model's tokenizer cannot be
    used by the grammar engine (then every constrained request is a 400)."""

    def __init__(self, tokenizer: TokenizerInfo | None, hf_tokenizer, cache: GrammarCache | None = None):
        self.tokenizer = tokenizer
        self.supports_tools = tokenizer is not None and tool_format.template_supports_tools(
            getattr(hf_tokenizer, "chat_template", None))
        if self.supports_tools:
            self.tags = tuple(tool_format.token_ref(t, hf_tokenizer, tokenizer.ll_tokenizer)
                              for t in (tool_format.OPEN, tool_format.CLOSE))
        self.cache = cache or default_cache

    def _compile(self, param: str, **spec_args) -> CompiledGrammar:
        if self.tokenizer is None:
            raise bad_request("guided generation is not available for this model's tokenizer", param)
        try:
            return self.cache.get(make_spec(**spec_args), self.tokenizer)
        except (SchemaError, GrammarError) as exc:
            raise from_library_error(exc, param) from None

    def structured(self, req: SamplingFields, response_format=None) -> Constraint | None:
        """The constraint of `response_format` (chat) or `structured_outputs` (both endpoints)."""
        if req.structured_outputs is not None and response_format is not None and response_format.type != "text":
            raise bad_request("give either response_format or structured_outputs, not both", "structured_outputs")
        if isinstance(response_format, JsonObjectFormat):
            return Constraint(self._compile("response_format", json_object=True), {"type": "object"})
        if isinstance(response_format, JsonSchemaFormat):
            spec = response_format.json_schema
            param = "response_format.json_schema.schema"
            schema = spec.schema_ if spec.schema_ is not None else {}
            # OpenAI's `strict: false` allows keys the schema does not declare; otherwise objects are closed.
            return Constraint(self._compile(param, schema=schema, strict=spec.strict is not False), schema)
        so = req.structured_outputs
        if so is None:
            return None
        if so.json_ is not None:
            return Constraint(self._compile("structured_outputs.json", schema=so.json_), so.json_)
        if so.regex is not None:
            return Constraint(self._compile("structured_outputs.regex", regex=so.regex))
        if so.choice is not None:
            return Constraint(self._compile("structured_outputs.choice", choices=so.choice))
        return Constraint(self._compile("structured_outputs.grammar", grammar=so.grammar))

    def for_chat(self, req: ChatCompletionRequest) -> Constraint | None:
        """The constraint of a chat request, or None for free text."""
        mode, functions = self.tool_mode(req)
        structured = self.structured(req, req.response_format)
        if mode is None:
            return structured
        if structured is not None:
            raise bad_request("response_format / structured_outputs cannot be combined with tools; "
                              "pass tool_choice: \"none\" to use them", "response_format")
        schemas = {}
        for i, tool in enumerate(req.tools):
            param = f"tools[{i}].function.parameters"
            try:
                schemas[tool.function.name] = tool_format.parameters_schema(tool.function)
            except SchemaError as exc:
                raise from_library_error(exc, param) from None
            # Compiled alone first, so an unenforceable keyword is reported with this tool's pointer.
            self._compile(param, schema=schemas[tool.function.name], strict=False)
        allowed = {f.name: schemas[f.name] for f in functions}
        grammar = tool_format.tool_grammar(allowed, mode=mode, parallel=req.parallel_tool_calls,
                                           open_ref=self.tags[0], close_ref=self.tags[1])
        return Constraint(self._compile("tools", grammar=grammar), None, schemas, mode)

    def tool_mode(self, req: ChatCompletionRequest):
        """("auto" | "required" | None, the functions a call may use) from tools and tool_choice."""
        if not req.tools or req.tool_choice == "none":
            return None, []
        if not self.supports_tools:
            raise bad_request("this model's chat template has no tool-call format this server knows "
                              "(Hermes/Qwen2.5 <tool_call>)", "tools")
        names = [t.function.name for t in req.tools]
        if len(set(names)) != len(names):
            raise bad_request("tool function names must be unique", "tools")
        functions = [t.function for t in req.tools]
        choice = req.tool_choice or "auto"
        if choice in ("auto", "required"):
            return choice, functions
        if choice.function.name not in names:
            raise bad_request(f"tool_choice names the function {choice.function.name!r}, which is not in tools",
                              "tool_choice")
        return "required", [f for f in functions if f.name == choice.function.name]
