"""The playground page (`/`) driven in a real headless Chromium, and the `token_provenance` stream
extension it reads.

The browser tests (marker `browser`) use Debian's `chromium` (.ci/run installs it) through Playwright's
Python package with `executable_path`: Playwright's own browser download is not reachable from our
machines. Without a Chromium they skip locally and fail on CI (CI=true), so CI never skips them. One
slowed tiny-model server and one browser serve the whole module.
"""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import httpx
import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from coreai.server.playground import STATIC
from guided import Constraint
from guided.enforcement import enforcement

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "mood": {"enum": ["calm", "busy"]},
        "code": {"type": "integer", "maximum": 99},
    },
    "required": ["ok", "mood", "code"],
}
TIMEOUT = 60_000  # ms: a generation on the tiny model takes well under a second


@pytest.fixture(scope="module")
def base(slow_tiny_model):
    # 5 ms a forward pass: a reply's chunks come apart, so a browser sees the text grow (the tiny
    # network alone may send a whole reply in one network read).
    with serve_in_thread(slow_tiny_model, ServerConfig(model_name="tiny", max_tokens=256, temperature=0.0)) as url:
        yield url


def sse(response: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


# ---- the extension, over HTTP -----------------------------------------------------------------------


def test_token_provenance_spells_the_content(base):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "token_provenance": True,
        "whitespace": "compact",
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
    }
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as response:
        chunks = sse(response)
    choices = [c["choices"][0] for c in chunks]
    tokens = [t for c in choices for t in c["token_provenance"]]
    content = "".join(c["delta"].get("content") or "" for c in choices)
    assert json.loads(content).keys() == {"ok", "mood", "code"} and "\n" not in content  # compact
    assert "".join(t["token"] for t in tokens) == content
    origins = {t["origin"] for t in tokens}
    assert origins <= {"sampled", "forced", "drafted"} and "forced" in origins
    stats = choices[-1]["generation_stats"]
    assert choices[-1]["finish_reason"] == "stop" and stats["completion_tokens"] == len(tokens)
    assert stats["forced_tokens"] == sum(t["origin"] == "forced" for t in tokens)
    assert stats["accepted_tokens"] == sum(t["origin"] == "drafted" for t in tokens)
    assert stats["tokens_per_pass"] == round(len(tokens) / stats["forward_passes"], 2)
    assert all("generation_stats" not in c for c in choices[:-1])


def test_a_token_inside_a_character_adds_nothing(base):
    # Byte-level tokens split CJK characters: each character's text goes to the token completing it.
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "token_provenance": True,
        "structured_outputs": {"regex": "(日本語|中文)!"},
    }
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as response:
        choices = [c["choices"][0] for c in sse(response)]
    tokens = [t for c in choices for t in c["token_provenance"]]
    content = "".join(c["delta"].get("content") or "" for c in choices)
    assert content in ("日本語!", "中文!") and "".join(t["token"] for t in tokens) == content
    assert "" in [t["token"] for t in tokens] and "\ufffd" not in "".join(t["token"] for t in tokens)


def test_token_provenance_is_opt_in_and_stream_only(base):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with httpx.stream("POST", base + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as response:
        assert all("token_provenance" not in c["choices"][0] for c in sse(response))
    refused = httpx.post(base + "/v1/chat/completions", json={**body, "token_provenance": True}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "token_provenance"


def test_the_page_and_its_files_are_served(base):
    page = httpx.get(base + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    shipped = sorted(p.name for p in STATIC.iterdir())  # every module the page imports, and its styles
    assert {"main.js", "schema.js", "enforcement.js", "playground.css"} <= set(shipped)
    for name in shipped:
        assert httpx.get(f"{base}/playground/{name}").status_code == 200, name
    assert "/" not in httpx.get(base + "/openapi.json").json()["paths"]


# ---- the page, in Chromium --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Chromium at {CHROMIUM}: .ci/run installs Debian's chromium package")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, base):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(base + "/")
    page.wait_for_selector("body[data-ready=yes]", timeout=TIMEOUT)
    yield page
    page.close()
    assert not errors, errors  # no uncaught script error


def ask(page, text: str) -> None:
    page.fill("#prompt", text)
    page.keyboard.press("Control+Enter")  # the keyboard path the page advertises
    page.wait_for_selector("body[data-running=no]", timeout=TIMEOUT)


@pytest.mark.browser
def test_page_loads(page):
    assert page.title() == "coreai playground"
    assert page.input_value("#model") == "tiny"
    assert page.inner_text("#enforcement .note") == "none: free text" and enforcement_rows(page) == []


@pytest.mark.browser
def test_schema_run_shows_a_valid_value_with_token_marks(page, tmp_path):
    page.check("input[name=mode][value=schema]")
    page.select_option("#schema-example", "A nested form")
    page.select_option("#whitespace", "compact")
    page.select_option("#schema-hints", "off")
    ask(page, "Fill in a shipping form for two books sent to Paris.")
    assert page.inner_text("#verdict").startswith("valid")
    value = json.loads(page.inner_text("#value"))
    assert {"customer", "items", "address"} <= value.keys()
    marks = page.locator("#tokens .tok")
    assert marks.count() > 10 and page.locator("#tokens .tok.forced").count() > 0
    assert "".join(marks.all_inner_texts()) == page.locator("#transcript .assistant").last.inner_text()
    assert enforcement_rows(page)[0] == ("grammar", "type", "/type", "")
    assert "tok/s" in page.inner_text("#timings") and "passes" in page.inner_text("#timings")
    # The test's own copy (docs/playground.png is the real model's: `make playground-screenshot`).
    page.screenshot(path=str(tmp_path / "playground.png"))


def error_terms(page) -> dict[str, str]:
    error = page.locator("#error")
    return dict(zip(error.locator("dt").all_inner_texts(), error.locator("dd").all_inner_texts(), strict=True))


def assert_idle(page) -> None:
    """The run is over: no "…" (waiting) left in the enforcement panel or the timings."""
    assert page.get_attribute("body", "data-running") == "no"
    for part in ("#enforcement", "#timings", "#verdict"):
        assert "…" not in page.inner_text(part), (part, page.inner_text(part))


BAD_SCHEMAS = {
    # name: (schema, keyword, pointer): each as the server's 400 names it
    "unknown type": ({"type": "object", "properties": {"a": {"type": "strin"}}}, "type", "/properties/a/type"),
    "dangling $ref": (
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
        "$ref",
        "/properties/a/$ref",
    ),
    "a name with ': '": (
        {"type": "object", "properties": {"first: name": {"type": "strin"}}},
        "type",
        "/properties/first: name/type",
    ),
    "not a schema": ({"type": "object", "properties": {"a": 5}}, "properties", "/properties/a"),
    "required holds a number": ({"type": "object", "required": [1]}, "required", "/required/0"),
    "not excludes all": (
        {"type": "object", "properties": {"a": {"not": {}}}, "required": ["a"]},
        "not",
        "/properties/a/not",
    ),
    "look-behind": ({"type": "string", "pattern": "(?<=a)b"}, "pattern", "/pattern"),
}


@pytest.mark.browser
@pytest.mark.parametrize("case", BAD_SCHEMAS, ids=list(BAD_SCHEMAS))
def test_bad_schema_shows_its_error(page, case):
    schema, keyword, pointer = BAD_SCHEMAS[case]
    page.check("input[name=mode][value=schema]")
    page.fill("#schema", json.dumps(schema))
    ask(page, "anything")
    error = page.locator("#error")
    assert error.is_visible() and "400" in error.inner_text()
    terms = error_terms(page)
    assert terms["code"] in ("invalid_schema", "unsupported_schema_feature")
    assert terms["keyword"] == keyword and terms["pointer"] == pointer, terms
    assert "tool" not in terms and "Traceback" not in error.inner_text()
    # Nothing was answered: the message is back in the prompt, not in the transcript.
    assert page.input_value("#prompt") == "anything" and page.locator("#transcript li").count() == 0
    assert page.inner_text("#verdict").startswith("no output")
    assert_idle(page)


@pytest.mark.browser
def test_a_bad_tool_schema_names_its_tool(page):
    tools = [
        {"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"q": {"$ref": "#/$defs/q"}}},
            },
        },
    ]
    page.check("input[name=mode][value=tools]")
    page.fill("#tools", json.dumps(tools))
    ask(page, "anything")
    terms = error_terms(page)
    assert terms["param"] == "tools[1].function.parameters" and terms["tool"] == "lookup"
    assert terms["keyword"] == "$ref" and terms["pointer"] == "/properties/q/$ref"
    assert_idle(page)


@pytest.mark.browser
def test_an_error_the_server_does_not_locate_says_so(page):
    # The engine's refusal names no place (strict mode closes the object: 3 properties cannot be).
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "minProperties": 3}
    page.check("input[name=mode][value=schema]")
    page.fill("#schema", json.dumps(schema))
    ask(page, "anything")
    terms = error_terms(page)
    assert terms["code"] == "invalid_schema" and terms["pointer"].startswith("not located")
    assert "keyword" not in terms
    assert_idle(page)


@pytest.mark.browser
def test_stopping_a_run_leaves_no_waiting_marks(page):
    page.fill("#max-tokens", "250")  # the server allows up to 256
    page.fill("#prompt", "Tell me a long story.")
    page.click("#send")
    page.wait_for_selector("#tokens .tok", state="attached", timeout=TIMEOUT)  # a token may be ""
    page.keyboard.press("Escape")
    page.wait_for_selector("body[data-running=no]", timeout=TIMEOUT)
    assert page.inner_text("#verdict").startswith("stopped")
    assert_idle(page)


# ---- the enforcement panel --------------------------------------------------------------------------


def enforcement_rows(page) -> list[tuple[str, str, str, str]]:
    """The panel's rows as (how, keyword, pointer, tool), tool "" for the answer's schema."""
    rows = page.eval_on_selector_all(
        "#enforcement tbody tr",
        "rows => rows.map(r => ['how', 'keyword', 'pointer', 'tool']"
        "  .map(c => r.querySelector(`[data-col=${c}]`)?.textContent ?? ''))",
    )
    return [tuple(r) for r in rows]


def report_rows(constraint: Constraint) -> list[tuple[str, str, str, str]]:
    return [(e.how, e.keyword, e.pointer, e.tool or "") for e in constraint.report]


EXTRACTION = {  # the page's "Extraction" example: maxLength, format and numeric bounds, all in the grammar
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "email", "age", "employed"],
}
MIXED = {  # grammar and validate-and-rollback side by side, and a name the header percent-encodes
    "type": "object",
    "properties": {
        "first name": {"type": "string", "maxLength": 12, "not": {"const": ""}},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "uniqueItems": True, "maxItems": 3},
    },
    "required": ["first name", "score", "tags"],
}


@pytest.mark.browser
@pytest.mark.parametrize("schema", [EXTRACTION, MIXED], ids=["all-grammar", "mixed"])
def test_enforcement_lists_every_keyword_as_the_server_enforces_it(page, slow_tiny_model, schema):
    page.check("input[name=mode][value=schema]")
    page.fill("#schema", json.dumps(schema))
    page.fill("#max-tokens", "40")
    ask(page, "Fill it in.")
    # Each keyword, how the server enforces it, at its (decoded) pointer: the server's own report.
    assert enforcement_rows(page) == report_rows(Constraint(slow_tiny_model, schema=schema, strict=True))
    assert_idle(page)


@pytest.mark.browser
def test_enforcement_under_tools_names_the_tool(page):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 30, "not": {"const": ""}}},
                    "required": ["city"],
                },
            },
        },
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
    ]
    page.check("input[name=mode][value=tools]")
    page.fill("#tools", json.dumps(tools))
    page.select_option("#tool-choice", "fn:get_weather")
    page.fill("#max-tokens", "40")
    ask(page, "What is the weather in Oslo?")
    rows = enforcement_rows(page)
    assert ("validate-and-rollback", "not", "/properties/city/not", "get_weather") in rows
    # inside the `not` validate-and-rollback checks: so is its `const`
    assert ("validate-and-rollback", "const", "/properties/city/not/const", "get_weather") in rows
    assert ("grammar", "maxLength", "/properties/city/maxLength", "get_weather") in rows
    assert {r[3] for r in rows} == {"get_weather"}  # the one function tool_choice names
    assert_idle(page)


WALKED = [  # schemas for the page's keyword walk: every applicator, annotations, drafts, escaped names
    {
        "title": "annotations are not listed",
        "description": "x",
        "$comment": "x",
        "examples": [{"type": "x"}],
        "x-vendor": {"type": "string"},
        "$defs": {"d": {"type": "integer", "multipleOf": 3, "default": 3}},
        "type": "object",
        "properties": {
            "a/b": {"$ref": "#/$defs/d"},
            "c~d": {"anyOf": [{"type": "string", "minLength": 1}, {"const": None}, True]},
            "e": {"allOf": [{"minimum": 1}], "oneOf": [{"maximum": 5}, {"enum": [9]}], "not": {"const": 4}},
            "f": {"if": {"minimum": 0}, "then": {"multipleOf": 2}, "else": {"maximum": -2}},
            "g": {
                "prefixItems": [{"type": "string"}],
                "items": {"type": "number"},
                "contains": {"const": 1},
                "minContains": 1,
            },
            "h": {"patternProperties": {"^x": {"type": "string"}}, "propertyNames": {"maxLength": 3}},
            "i": {"dependentRequired": {"a": ["b"]}, "dependentSchemas": {"a": {"required": ["c"]}}},
            "j": {"unevaluatedProperties": False, "additionalProperties": {"type": "boolean"}, "maxProperties": 4},
        },
        "required": ["a/b"],
        "additionalProperties": False,
    },
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"n": {"type": "number", "exclusiveMaximum": 3}},
        "type": "array",
        "items": [{"$ref": "#/definitions/n"}, {"type": "string", "format": "date"}],
        "additionalItems": {"type": "null"},
        "dependencies": {"a": ["b"], "c": {"minProperties": 1}},
        "uniqueItems": True,
    },
    {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {"x": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "const": 3}},
    },
    {
        "$schema": "https://json-schema.org/draft/2019-09/schema",
        "type": "array",
        "items": {"$recursiveRef": "#"},
        "unevaluatedItems": False,
        "dependentRequired": {"a": []},
    },
]


@pytest.mark.browser
@pytest.mark.parametrize("schema", WALKED, ids=["2020-12", "draft-07", "draft-04", "2019-09"])
def test_the_pages_keyword_walk_is_the_servers(page, schema):
    """The page lists the keywords the server's report walks (guided.enforcement), from the schema it
    sent: the keywords the header leaves out are the ones the grammar enforces."""
    walked = page.evaluate("async (s) => (await import('/playground/schema.js')).assertingKeywords(s)", schema)
    compiled = SimpleNamespace(spec=SimpleNamespace(kind="json_schema", schema=schema), validated=(), not_enforced=())
    assert [(k["keyword"], k["pointer"]) for k in walked] == [(e.keyword, e.pointer) for e in enforcement(compiled)]


@pytest.mark.browser
def test_the_pages_drafts_are_the_servers(page):
    """The page's keywords of each draft (schema.js DRAFTS) are those of the validator the server
    reads that draft with (guided.validation.validator_class), for every draft jsonschema knows."""
    import jsonschema

    from guided.validation import validator_class

    drafts = page.evaluate("async () => (await import('/playground/schema.js')).DRAFTS")
    known = [jsonschema.Draft3Validator, jsonschema.Draft4Validator, jsonschema.Draft6Validator]
    known += [jsonschema.Draft7Validator, jsonschema.Draft201909Validator, jsonschema.Draft202012Validator]
    assert set(drafts) == {(v.META_SCHEMA.get("$id") or v.META_SCHEMA["id"]).rstrip("#") for v in known}
    for uri, keywords in drafts.items():
        assert keywords == sorted(validator_class({"$schema": uri + "#"}).VALIDATORS), uri
    assert drafts["https://json-schema.org/draft/2020-12/schema"] == sorted(validator_class({}).VALIDATORS)


@pytest.mark.browser
def test_streaming_text_appears_progressively(page):
    page.fill("#max-tokens", "200")
    page.fill("#prompt", "Tell me a story.")
    # Record the reply's length at every change while it streams: it must grow in several steps.
    page.evaluate("""() => {
        window.lengths = [];
        new MutationObserver(() => {
            const reply = document.querySelector('#transcript .assistant:last-child');
            if (reply) window.lengths.push(reply.textContent.length);
        }).observe(document.getElementById('transcript'), {subtree: true, childList: true, characterData: true});
    }""")
    page.click("#send")
    page.wait_for_selector("body[data-running=no]", timeout=TIMEOUT)
    lengths = [n for n in page.evaluate("window.lengths") if n]
    assert len(set(lengths)) >= 5 and lengths == sorted(lengths)
    assert page.inner_text("#verdict").startswith("cut by max tokens")


@pytest.mark.browser
def test_a_tool_call_is_shown_as_a_call(page):
    page.check("input[name=mode][value=tools]")
    page.select_option("#tool-choice", "fn:get_weather")
    ask(page, "What is the weather in Oslo?")
    call = page.locator("#transcript .assistant .call")
    assert call.count() == 1 and call.locator("b").inner_text() == "get_weather"
    value = json.loads(page.inner_text("#value"))
    assert value[0]["name"] == "get_weather" and {"city", "unit"} <= value[0]["arguments"].keys()
    assert page.inner_text("#verdict").startswith("valid: 1 tool call(s)")


@pytest.mark.browser
@pytest.mark.parametrize("width", [1440, 390])
def test_readable_at_laptop_and_phone_widths(browser, base, width, tmp_path):
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(base + "/")
    page.wait_for_selector("body[data-ready=yes]", timeout=TIMEOUT)
    # Nothing wider than the window: no sideways scrolling at either width, also once the
    # enforcement table lists a nested schema's keywords and pointers.
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.check("input[name=mode][value=schema]")
    page.select_option("#schema-example", "A nested form")
    page.fill("#max-tokens", "20")
    ask(page, "Fill in a shipping form.")
    assert len(enforcement_rows(page)) > 20
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.screenshot(path=str(tmp_path / f"playground-{width}.png"), full_page=True)
    page.close()


@pytest.mark.browser
def test_the_api_docs_render_offline(browser, base):
    """`/docs` (Swagger UI) and `/redoc` load their scripts from this server: with every request to
    another host refused, as on a Mac without a network, the pages still list the routes. (ReDoc's
    "powered by" logo is an image from its CDN: it is refused, and nothing else depends on it.)"""
    page = browser.new_page()
    outside = []

    def only_local(route):
        if route.request.url.startswith(base):
            route.continue_()
        else:
            if route.request.resource_type != "image":
                outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(base + "/docs")
    page.get_by_text("/v1/chat/completions").first.wait_for(timeout=TIMEOUT)
    assert "coreai-mlx" in page.locator(".swagger-ui .info .title").inner_text()
    page.goto(base + "/redoc")
    page.get_by_text("/v1/messages").first.wait_for(timeout=TIMEOUT)
    page.close()
    assert not outside, outside
