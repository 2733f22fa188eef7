// The chat request the page sends, from the constraint panel and the settings.

/** A mistake in the page's own inputs (not JSON, no choices), shown before anything is sent. */
export class InputError extends Error {}

function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new InputError(`${what} is not JSON: ${e.message}`);
  }
}

/** The tool_choice value of the select's option value ("auto", "required", "none", or "fn:NAME"). */
export function toolChoice(value) {
  return value.startsWith("fn:") ? { type: "function", function: { name: value.slice(3) } } : value;
}

/**
 * The body of a streamed chat completion with the `token_provenance` extension.
 * `form`: {model, mode, schema, regex, choices, lark, tools, toolChoice, temperature, maxTokens, whitespace, hints}.
 * Throws InputError for an editor that does not parse.
 */
export function buildRequest(form, messages) {
  const body = {
    model: form.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    token_provenance: true,
  };
  if (form.temperature !== "") body.temperature = Number(form.temperature);
  if (form.maxTokens !== "") body.max_tokens = Number(form.maxTokens);
  const json = form.mode === "schema";
  if (form.whitespace && json) body.whitespace = form.whitespace;
  if (form.hints && json) body.schema_in_prompt = form.hints === "on";
  if (json) {
    const schema = parseJson(form.schema, "The schema");
    body.response_format = { type: "json_schema", json_schema: { name: "playground", schema, strict: true } };
  } else if (form.mode === "regex") {
    body.structured_outputs = { regex: form.regex };
  } else if (form.mode === "choice") {
    const choice = form.choices.split("\n").map((c) => c.trim()).filter(Boolean);
    if (!choice.length) throw new InputError("Give at least one choice, one a line.");
    body.structured_outputs = { choice };
  } else if (form.mode === "lark") {
    body.structured_outputs = { grammar: form.lark };
  } else if (form.mode === "tools") {
    body.tools = parseJson(form.tools, "The tools");
    body.tool_choice = toolChoice(form.toolChoice);
    body.parallel_tool_calls = false;
  }
  return body;
}
