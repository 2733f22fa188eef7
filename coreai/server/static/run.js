// One streamed reply as it accumulates from its chunks (choice 0): content, tool calls, tokens, finish, stats.

export class Run {
  constructor(mode) {
    this.mode = mode; // the constraint panel's mode: how to read the output
    this.started = performance.now();
    this.firstToken = null; // ms since start when the first token came (the page's own TTFT)
    this.content = "";
    this.calls = []; // [{id, name, arguments}] by index
    this.tokens = []; // [{id, token, origin}] (the token_provenance extension)
    this.finish = null;
    this.refusal = null;
    this.stats = null; // generation_stats of the last chunk
    this.failed = false; // the server refused the request, or the stream broke
    this.stopped = false; // the person stopped it (Stop, Esc)
    this.ended = false; // the request is over (answered, refused, stopped or broken): nothing more will come
  }

  /** Fold one chat.completion.chunk into the run. */
  add(chunk) {
    const choice = chunk.choices[0];
    if (!choice) return;
    const delta = choice.delta || {};
    if (delta.content) this.content += delta.content;
    if (delta.refusal) this.refusal = delta.refusal;
    for (const call of delta.tool_calls || []) {
      const slot = (this.calls[call.index] ||= { id: "", name: "", arguments: "" });
      if (call.id) slot.id = call.id;
      if (call.function?.name) slot.name = call.function.name;
      if (call.function?.arguments) slot.arguments += call.function.arguments;
    }
    if (choice.token_provenance?.length) {
      if (this.firstToken === null) this.firstToken = performance.now() - this.started;
      this.tokens.push(...choice.token_provenance);
    }
    if (choice.generation_stats) this.stats = choice.generation_stats;
    if (choice.finish_reason) this.finish = choice.finish_reason;
  }

  /** {state: "valid" | "invalid" | "cut" | "free" | "running", text, value}: what the output is worth. */
  verdict() {
    if (this.failed) return { state: "invalid", text: "no output: see the error above" };
    if (this.stopped && !this.finish) return { state: "cut", text: "stopped: the output is incomplete", value: this.value() };
    if (!this.finish && this.ended) return { state: "cut", text: "the stream ended without a finish reason", value: this.value() };
    if (!this.finish) return { state: "running", text: "generating…" };
    const value = this.value();
    if (this.finish === "error") return { state: "invalid", text: `invalid: ${this.refusal || "the generation failed"}`, value };
    if (this.finish === "length") return { state: "cut", text: "cut by max tokens: the output is incomplete", value };
    if (this.mode === "none") return { state: "free", text: "free text (no constraint)", value };
    const what = this.calls.length ? `${this.calls.length} tool call(s)` : "the output";
    return { state: "valid", text: `valid: ${what} checked by the server against the constraint`, value };
  }

  /** The parsed value: the calls with their arguments parsed, the JSON content, or the text itself. */
  value() {
    if (this.calls.length) return this.calls.map((c) => ({ name: c.name, arguments: parseOr(c.arguments) }));
    if (this.mode === "schema") return parseOr(this.content);
    return this.content;
  }
}

function parseOr(text) {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
