// The enforcement panel: every keyword of the schema (or the tools' parameters) the page sent, and
// how the server enforces it, from the reply's `x-coreai-enforcement` header.
//
// The header (coreai.server.constraints.enforcement_headers) lists the keywords enforced otherwise
// than by the grammar, "<how> <keyword> <pointer>[ (tool <name>)]" joined by "; ", pointers
// percent-encoded; "grammar" alone when the grammar enforces them all. So each keyword of the sent
// schema that the header does not list is the grammar's, unless it lies inside one the header lists
// (a `const` inside a `not` that validate-and-rollback checks in a tool's calls).

import { assertingKeywords } from "./schema.js";

const GRAMMAR = "grammar";
const ENTRY = /^(grammar|validate-and-rollback|not enforced) (\S+) (\S+)(?: \(tool (.+)\))?$/;
const CUSTOM_TOOL = /^(grammar \S+|free text) \(tool (.+)\)$/; // a custom tool's input: its grammar, or any text

function decode(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/** The header's entries [{how, keyword, pointer, tool}] (pointers decoded, tool "" for the answer) and its other parts. */
export function parseHeader(header) {
  const entries = [];
  const notes = [];
  for (const part of header.split("; ")) {
    let m;
    if ((m = ENTRY.exec(part))) entries.push({ how: m[1], keyword: m[2], pointer: decode(m[3]), tool: m[4] ?? "" });
    else if ((m = CUSTOM_TOOL.exec(part))) entries.push({ how: m[1], keyword: "", pointer: "", tool: m[2] });
    else notes.push(part); // "grammar", the any-JSON note, "and N more (...)"
  }
  return { entries, notes };
}

/** The JSON Schemas a request holds its output to: [{tool, schema}] (tool "" for the answer's). */
function sentSchemas(body) {
  const answer = body.response_format?.json_schema?.schema ?? body.response_format?.schema ?? body.structured_outputs?.json;
  if (answer !== undefined) return [{ tool: "", schema: answer }];
  if (!body.tools || body.tool_choice === "none") return [];
  const named = body.tool_choice?.function?.name;
  return body.tools
    .filter((t) => t.type === "function" && t.function?.parameters && (!named || t.function.name === named))
    .map((t) => ({ tool: t.function.name, schema: t.function.parameters }));
}

/**
 * The panel of a reply to `body` with header `header` (null: no constraint):
 * {note, rows: [{how, keyword, pointer, tool}]}, the rows in the server's report order.
 */
export function enforcementReport(body, header) {
  if (!header) return { note: "none: free text", rows: [] };
  const { entries, notes } = parseHeader(header);
  const documents = sentSchemas(body);
  if (!documents.length) {
    // regex, choices, a grammar: the grammar enforces the whole output
    const note = header === GRAMMAR ? "grammar: the whole output" : notes.join("; ");
    return { note, rows: entries };
  }
  const cut = notes.find((n) => n.startsWith("and ")); // the header stops at 32 entries
  const key = (e) => `${e.tool}\u0000${e.keyword}\u0000${e.pointer}`;
  const listed = new Map(entries.map((e) => [key(e), e]));
  const rows = [];
  for (const { tool, schema } of documents) {
    for (const { keyword, pointer } of assertingKeywords(schema)) {
      const entry = listed.get(key({ tool, keyword, pointer }));
      if (entry) {
        rows.push(entry);
        listed.delete(key(entry));
        continue;
      }
      const outer = entries.find((e) => e.tool === tool && e.keyword && e.how !== GRAMMAR && pointer.startsWith(e.pointer + "/"));
      const how = outer ? outer.how : cut ? "not in the header" : GRAMMAR;
      rows.push({ how, keyword, pointer, tool });
    }
  }
  rows.push(...listed.values()); // custom tools' inputs (and anything the page's walk did not find)
  const counts = new Map();
  for (const row of rows) counts.set(row.how, (counts.get(row.how) || 0) + 1);
  const summary = [...counts].map(([how, n]) => `${n} ${how}`).join(", ");
  let note = rows.length ? `${rows.length} ${rows.length === 1 ? "entry" : "entries"}: ${summary}` : notes.join("; ");
  if (cut) note += `; the header ${cut}`;
  return { note, rows };
}
