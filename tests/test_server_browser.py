"""CORS as a browser sees it (`coreai serve --cors-origin`), in a real headless Chromium (Debian's,
through Playwright, as tests/test_playground.py drives it): a page served from another loopback port
can call the server when its origin is allowed, and cannot when it is not (the default)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import threading

import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from tests.test_playground import CHROMIUM

pytestmark = pytest.mark.browser

# The page's script: a JSON POST (preflighted: content-type and authorization) and a plain GET.
CALL = """async (base) => {
  const out = {};
  try {
    const r = await fetch(base + "/v1/chat/completions", {
      method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer k"},
      body: JSON.stringify({model: "tiny", messages: [{role: "user", content: "hi"}], max_tokens: 2}),
    });
    out.post = r.status + " " + (await r.json()).object;
  } catch (e) { out.post = "blocked: " + e.message; }
  try {
    const r = await fetch(base + "/v1/models", {headers: {"Authorization": "Bearer k"}});
    out.get = r.status + " " + (await r.json()).data[0].id;
  } catch (e) { out.get = "blocked: " + e.message; }
  return out;
}"""


@contextlib.contextmanager
def static_site(folder):
    """A plain HTTP server for `folder` on a free loopback port (another origin); yields its origin."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{site.server_address[1]}"
    finally:
        site.shutdown()
        site.server_close()
        thread.join()


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


@pytest.mark.parametrize("allowed", [True, False])
def test_a_page_of_another_origin_calls_the_server_only_when_allowed(browser, tiny_model, tmp_path, allowed):
    (tmp_path / "index.html").write_text("<!doctype html><title>app</title><p>another origin</p>")
    with static_site(tmp_path) as origin:
        config = ServerConfig(model_name="tiny", api_key="k", cors_origins=(origin,) if allowed else ())
        with serve_in_thread(tiny_model, config) as base:
            page = browser.new_page()
            page.goto(origin + "/")
            result = page.evaluate(CALL, base)
            page.close()
    if allowed:
        assert result == {"post": "200 chat.completion", "get": "200 tiny"}
    else:
        assert result["post"].startswith("blocked") and result["get"].startswith("blocked"), result
