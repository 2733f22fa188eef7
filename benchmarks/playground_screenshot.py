"""The playground's screenshot in the docs (`make playground-screenshot`; not a benchmark, and not a
test: the browser tests write their screenshots under pytest's tmp_path, so a test run leaves the
checkout clean).

Serves the embedded default model (`coreai.load()`, what `coreai serve` serves; exported into
`$COREAI_HOME` or ~/.cache/coreai on first use) on loopback with the server's defaults, opens the
page in Debian's headless Chromium (Playwright with `executable_path`, as tests/test_playground.py),
runs the "Extraction" JSON Schema example at temperature 0, and saves the window (1440 x 1020) once the
verdict is "valid". Anything else (no Chromium, an error, an invalid or cut output) exits non-zero and
writes nothing.

    python -m benchmarks.playground_screenshot [--out docs/playground.png] [--model NAME]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import coreai
from coreai import store

DOCS_PNG = Path(__file__).resolve().parents[1] / "docs" / "playground.png"
EXAMPLE = "Extraction"  # coreai/server/static/examples.js: maxLength, format and numeric bounds
TIMEOUT = 600_000  # ms: a generation on the CPU, with the first compile of its schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS_PNG, help="where to write the PNG (default: %(default)s)")
    parser.add_argument("--model", default=store.DEFAULT_MODEL, help="model to serve (default: %(default)s)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    if not Path(args.chromium).exists():
        print(f"no Chromium at {args.chromium} (apt-get install chromium)", file=sys.stderr)
        return 2

    from playwright.sync_api import sync_playwright

    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    model = coreai.load(args.model)
    with serve_in_thread(model, ServerConfig()) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": 1020})  # down to the timings
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url + "/")
        page.wait_for_selector("body[data-ready=yes]", timeout=TIMEOUT)
        page.check("input[name=mode][value=schema]")
        page.select_option("#schema-example", EXAMPLE)  # also fills the empty prompt with its own
        if not page.input_value("#prompt"):
            print(f"the {EXAMPLE!r} example left the prompt empty", file=sys.stderr)
            return 1
        page.fill("#temperature", "0")
        page.click("#send")
        page.wait_for_selector("body[data-running=no]", timeout=TIMEOUT)
        verdict = page.inner_text("#verdict")
        if errors or not verdict.startswith("valid") or page.locator("#error").is_visible():
            print(
                f"not saved: verdict {verdict!r}, error {page.inner_text('#error')!r}, page errors {errors}",
                file=sys.stderr,
            )
            browser.close()
            return 1
        page.evaluate("document.activeElement.blur(); window.scrollTo(0, 0)")  # the window as a visitor sees it
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out))
        print(f"{args.out}: {model.name}, {verdict}; {page.inner_text('#counts').lstrip('— ')}")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
