// Rendering: the transcript, the token marks, the value and its verdict, enforcement, timings, errors.

import { schemaErrorPlace } from "./schema.js";

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, attrs);
  node.append(...children);
  return node;
}

/** Append a transcript entry; returns its element. */
export function addMessage(role, text) {
  const item = el("li", { className: role }, text);
  $("transcript").append(item);
  item.scrollIntoView({ block: "nearest" });
  return item;
}

/** Fill an assistant entry with the run's content and its tool calls (each shown as a call). */
export function showReply(item, run) {
  item.replaceChildren(run.content);
  for (const call of run.calls) {
    item.append(el("div", { className: "call", title: call.id }, el("b", {}, call.name || "…"), `(${call.arguments})`));
  }
  item.scrollIntoView({ block: "nearest" });
}

const ORIGINS = ["sampled", "forced", "drafted"];

/** The output's tokens, each marked by its origin, and the count of each origin. */
export function showTokens(tokens) {
  $("tokens").replaceChildren(
    ...tokens.map((t) => el("span", { className: `tok ${t.origin}`, title: `${t.origin} · id ${t.id}` }, t.token)),
  );
  const counts = ORIGINS.map((o) => `${tokens.filter((t) => t.origin === o).length} ${o}`);
  $("counts").textContent = tokens.length ? `— ${tokens.length} tokens: ${counts.join(", ")}` : "";
}

export function showVerdict(run) {
  const verdict = run.verdict();
  $("verdict").textContent = verdict.text;
  $("verdict").className = verdict.state;
  const value = verdict.value;
  $("value").textContent = value === undefined ? "" : typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

/**
 * The enforcement panel: a note, and a row for each entry {how, keyword, pointer, tool} (see
 * enforcement.js); the tool column only when a row names a tool.
 */
export function showEnforcement({ note, rows = [] }) {
  const columns = ["how", "keyword", "pointer", ...(rows.some((r) => r.tool) ? ["tool"] : [])];
  const table = rows.length
    ? el(
        "table",
        {},
        el("thead", {}, el("tr", {}, ...columns.map((c) => el("th", { scope: "col" }, c)))),
        el("tbody", {}, ...rows.map((r) => el("tr", { className: r.how.replaceAll(" ", "-") }, ...columns.map((c) => cell(c, r[c]))))),
      )
    : "";
  $("enforcement").replaceChildren(el("p", { className: "note" }, note), table);
}

function cell(column, value) {
  // a long pointer may break after each "/" (<wbr>: its text stays the pointer)
  const parts = column === "pointer" ? value.split("/").flatMap((p, i) => (i ? [el("wbr"), "/" + p] : [p])) : [value];
  const td = el("td", {}, column === "pointer" || column === "keyword" ? el("code", {}, ...parts) : value);
  td.dataset.col = column;
  return td;
}

/** The run's timings: "…" while it runs and a figure is still to come, "—" once it ended without one. */
export function showTimings(run) {
  const s = run.stats;
  const none = run.ended ? "—" : "…";
  const rows = [
    ["TTFT (server)", s ? `${(s.ttft * 1000).toFixed(0)} ms` : none],
    ["first token (page)", run.firstToken === null ? none : `${run.firstToken.toFixed(0)} ms`],
    ["decode", s ? `${s.decode_tps.toFixed(1)} tok/s` : none],
    ["tokens per forward pass", s ? `${s.tokens_per_pass.toFixed(2)} (${s.completion_tokens} tokens, ${s.forward_passes} passes)` : none],
    ["drafts accepted", s ? `${s.accepted_tokens} of ${s.drafted_tokens}` : none],
  ];
  $("timings").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

/**
 * Show an error: the server's error object (status, type, code, param; for a schema error the keyword
 * and JSON pointer its message names, and the tool whose parameters hold it), or the page's own input
 * error. `body`: the request it answered (where the pointer points). null hides it.
 */
export function showError(error, body = null) {
  const box = $("error");
  box.hidden = !error;
  if (!error) return box.replaceChildren();
  if (!error.error) return box.replaceChildren(el("strong", {}, "Your input: "), error.message);
  const e = error.error;
  const rows = [["type", e.type], ["code", e.code], ["param", e.param]];
  const place = schemaErrorPlace(e, body);
  if (place.tool) rows.push(["tool", place.tool]);
  if (SCHEMA_CODES.has(e.code)) {
    rows.push(["keyword", place.keyword], ["pointer", place.pointer ?? "not located (the server's message names no place)"]);
  }
  const title = error.status ? `The server answered ${error.status}` : "The server reported an error";
  box.replaceChildren(
    el("strong", {}, `${title}: `),
    e.message,
    el("dl", {}, ...rows.filter(([, v]) => v).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, el("code", {}, String(v)))])),
  );
  box.scrollIntoView({ block: "nearest" }); // on a phone the output column is below the chat
}

const SCHEMA_CODES = new Set(["invalid_schema", "unsupported_schema_feature"]);
