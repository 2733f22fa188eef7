// Rendering: the transcript, the token marks, the value and its verdict, enforcement, timings, errors.

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

export function showTimings(run) {
  const s = run.stats;
  const rows = [
    ["TTFT (server)", s ? `${(s.ttft * 1000).toFixed(0)} ms` : "…"],
    ["first token (page)", run.firstToken === null ? "…" : `${run.firstToken.toFixed(0)} ms`],
    ["decode", s ? `${s.decode_tps.toFixed(1)} tok/s` : "…"],
    ["tokens per forward pass", s ? `${s.tokens_per_pass.toFixed(2)} (${s.completion_tokens} tokens, ${s.forward_passes} passes)` : "…"],
    ["drafts accepted", s ? `${s.accepted_tokens} of ${s.drafted_tokens}` : "…"],
  ];
  $("timings").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

/**
 * Show an error: the server's error object (status, type, code, param, and for a schema error the
 * keyword and JSON pointer its message names), or the page's own input error. null hides it.
 */
export function showError(error) {
  const box = $("error");
  box.hidden = !error;
  if (!error) return box.replaceChildren();
  if (!error.error) return box.replaceChildren(el("strong", {}, "Your input: "), error.message);
  const e = error.error;
  const rows = [["type", e.type], ["code", e.code], ["param", e.param]];
  const at = /\bat (\/\S*|#\S*):/.exec(e.message || ""); // "invalid schema at /properties/a/type: ..."
  if (at) {
    const pointer = at[1];
    rows.push(["keyword", pointer.split("/").pop()], ["pointer", pointer]);
  }
  const title = error.status ? `The server answered ${error.status}` : "The server reported an error";
  box.replaceChildren(
    el("strong", {}, `${title}: `),
    e.message,
    el("dl", {}, ...rows.filter(([, v]) => v).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, el("code", {}, String(v)))])),
  );
  box.scrollIntoView({ block: "nearest" }); // on a phone the output column is below the chat
}
