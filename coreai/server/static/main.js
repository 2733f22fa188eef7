// The page's wiring: the controls, the conversation, and one streamed run at a time.

import { listModels, streamChat } from "./api.js";
import { enforcementReport } from "./enforcement.js";
import { LARK, SCHEMAS, TOOLS, pretty } from "./examples.js";
import { buildRequest, InputError } from "./request.js";
import { Run } from "./run.js";
import * as view from "./view.js";

const $ = (id) => document.getElementById(id);
const messages = []; // the conversation sent with each request
let controller = null; // the running request's AbortController

const mode = () => document.querySelector("input[name=mode]:checked").value;

function showMode() {
  for (const panel of document.querySelectorAll("[data-mode]")) panel.hidden = panel.dataset.mode !== mode();
}

function loadSchemaExample(name) {
  $("schema").value = pretty(SCHEMAS[name].schema);
  if (!$("prompt").value.trim()) $("prompt").value = SCHEMAS[name].prompt;
}

/** tool_choice's options: auto, required, none, and each function of the tools editor by name. */
function fillToolChoice() {
  const select = $("tool-choice");
  const kept = select.value;
  let names = [];
  try {
    names = JSON.parse($("tools").value).map((t) => t.function.name);
  } catch {
    // the editor does not parse (yet): keep the fixed choices; sending says what is wrong
  }
  select.replaceChildren(...["auto", "required", "none"].map((v) => new Option(v, v)), ...names.map((n) => new Option(`function ${n}`, `fn:${n}`)));
  if ([...select.options].some((o) => o.value === kept)) select.value = kept;
}

function form() {
  return {
    model: $("model").value,
    mode: mode(),
    schema: $("schema").value,
    regex: $("regex").value,
    choices: $("choices").value,
    lark: $("lark").value,
    tools: $("tools").value,
    toolChoice: $("tool-choice").value,
    temperature: $("temperature").value,
    maxTokens: $("max-tokens").value,
    whitespace: $("whitespace").value,
    hints: $("schema-hints").value,
  };
}

function busy(running) {
  $("send").disabled = running;
  $("stop").disabled = !running;
  document.body.dataset.running = running ? "yes" : "no";
}

async function send(event) {
  event?.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  const conversation = [...messages, { role: "user", content: text }];
  let body;
  try {
    body = buildRequest(form(), conversation);
  } catch (e) {
    if (e instanceof InputError) return view.showError(e);
    throw e;
  }
  view.showError(null);
  const run = new Run(mode());
  const asked = view.addMessage("user", text);
  const item = view.addMessage("assistant", "");
  let answered = false; // the server accepted the request (its headers came)
  view.showEnforcement({ note: "…" });
  const update = () => {
    view.showReply(item, run);
    view.showTokens(run.tokens);
    view.showVerdict(run);
    view.showTimings(run);
  };
  $("prompt").value = "";
  controller = new AbortController();
  busy(true);
  update();
  try {
    await streamChat(body, $("api-key").value, {
      onHeaders: (headers) => {
        answered = true;
        view.showEnforcement(enforcementReport(body, headers.get("x-coreai-enforcement")));
      },
      onChunk: (chunk) => {
        run.add(chunk);
        update();
      },
    }, controller.signal);
    messages.push({ role: "user", content: text }, reply(run));
  } catch (e) {
    if (e.name === "AbortError") {
      run.stopped = true;
    } else {
      // Nothing was answered: the message goes back to the prompt, to be sent again once fixed.
      run.failed = true;
      view.showError(e, body);
      asked.remove();
      item.remove();
      $("prompt").value = text;
    }
  } finally {
    // Whatever ended the run (an answer, an error, Stop), nothing is left waiting ("…").
    controller = null;
    run.ended = true;
    if (!answered) view.showEnforcement({ note: run.stopped ? "stopped before the server answered" : "no reply: see the error above" });
    busy(false);
    if (!run.failed) update();
    else {
      view.showVerdict(run);
      view.showTimings(run);
    }
    $("prompt").focus();
  }
}

/** The assistant message to keep in the conversation. */
function reply(run) {
  const message = { role: "assistant", content: run.content };
  if (run.calls.length) {
    message.tool_calls = run.calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
  }
  return message;
}

async function init() {
  const select = $("schema-example");
  select.replaceChildren(...Object.keys(SCHEMAS).map((name) => new Option(name, name)));
  select.addEventListener("change", () => loadSchemaExample(select.value));
  $("schema").value = pretty(SCHEMAS[select.value].schema);
  $("lark").value = LARK;
  $("tools").value = pretty(TOOLS);
  fillToolChoice();
  $("tools").addEventListener("input", fillToolChoice);
  for (const radio of document.querySelectorAll("input[name=mode]")) radio.addEventListener("change", showMode);
  showMode();
  $("ask").addEventListener("submit", send);
  $("stop").addEventListener("click", () => controller?.abort());
  $("clear").addEventListener("click", () => {
    messages.length = 0;
    $("transcript").replaceChildren();
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) send(e);
    if (e.key === "Escape") controller?.abort();
  });
  $("api-key").value = sessionStorage.getItem("coreai-key") || "";
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("coreai-key", $("api-key").value);
    loadModels();
  });
  view.showEnforcement(enforcementReport({}, null));
  const idle = new Run("none");
  idle.ended = true; // nothing sent yet: no figures, and none to wait for
  view.showTimings(idle);
  await loadModels();
  document.body.dataset.ready = "yes"; // the page is wired (tests wait for it)
}

async function loadModels() {
  try {
    const ids = await listModels($("api-key").value);
    $("model").replaceChildren(...ids.map((id) => new Option(id, id)));
    view.showError(null);
  } catch (e) {
    view.showError(e);
  }
}

init();
