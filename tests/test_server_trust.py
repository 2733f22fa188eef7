"""Who may talk to the server (`coreai.server.trust`): the Host allow-list against DNS rebinding, the
Origin check and CORS opt-in, API keys checked before routing; on a real uvicorn server on loopback
with the tiny model, with forged headers sent by httpx. The browser's side of CORS is in
tests/test_server_browser.py."""

from __future__ import annotations

import argparse

import anthropic
import httpx
import openai
import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.commands.serve import api_keys
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from coreai.server.trust import host_allowed, host_name
from runtime.errors import InputError

KEYS = ("key-one", "key-two")
ALLOWED_ORIGIN = "http://127.0.0.1:5555"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MESSAGE = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def guarded(tiny_model):
    config = ServerConfig(
        model_name="tiny", api_keys=KEYS, allowed_hosts=("MyHost.LAN.",), cors_origins=(ALLOWED_ORIGIN,)
    )
    with serve_in_thread(tiny_model, config) as base:
        yield base


def auth(key: str = KEYS[1]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# ---- the Host allow-list ----------------------------------------------------------------------------

ALLOWED = ["127.0.0.1", "127.0.0.1:9", "127.1.2.3", "LOCALHOST", "localhost.", "LocalHost.:80", "[::1]", "[::1]:8080"]
ALLOWED += ["[::ffff:127.0.0.1]:1", "myhost.lan", "MYHOST.lan.:8080"]
REFUSED = ["evil.example", "evil.example:8080", "EVIL.Example.", "10.0.0.1", "10.0.0.1:8080", "[fe80::1]:8080"]
REFUSED += ["[2001:db8::1]", "localhost.evil.example", "127.0.0.1.nip.io", "sub.myhost.lan", ""]
ROUTES = [
    ("GET", "/health", None),
    ("GET", "/", None),
    ("GET", "/playground/main.js", None),
    ("GET", "/openapi.json", None),
    ("GET", "/docs", None),
    ("GET", "/v1/models", None),
    ("GET", "/v1/nope", None),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 2}),
    ("POST", "/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 2}),
    ("GET", "/v1/responses/resp_123", None),
    ("POST", "/v1/messages", MESSAGE),
]


@pytest.mark.parametrize("host", REFUSED)
def test_a_forged_host_is_refused_on_every_route(guarded, host):
    for method, path, body in ROUTES:
        r = httpx.request(method, guarded + path, json=body, headers={"Host": host, **auth()})
        assert r.status_code == 403, (host, path, r.text)
        if path == "/v1/messages":  # Anthropic's error shape there
            assert r.json()["error"]["type"] == "permission_error" and "--allowed-host" in r.json()["error"]["message"]
        else:
            assert r.json()["error"]["code"] == "host_not_allowed", (path, r.text)
            assert "DNS rebinding" in r.json()["error"]["message"]


@pytest.mark.parametrize("host", ALLOWED)
def test_loopback_and_allowed_hosts_pass(guarded, host):
    assert httpx.get(guarded + "/health", headers={"Host": host}).status_code == 200
    r = httpx.post(guarded + "/v1/chat/completions", json=CHAT, headers={"Host": host, **auth()})
    assert r.status_code == 200, r.text


def test_host_rules():
    assert host_name("[::1]:8080") == "::1" and host_name("LocalHost.:80") == "localhost"
    assert host_name("2001:db8::1") == "2001:db8::1"  # a bare IPv6 address keeps its colons
    # The address a request arrived at (a server bound to 0.0.0.0 reached on its LAN address).
    assert host_allowed("192.168.1.5:8080", frozenset(), "192.168.1.5")
    assert not host_allowed("192.168.1.6:8080", frozenset(), "192.168.1.5")
    assert host_allowed("[fe80::1]", frozenset(), "fe80::1%eth0")
    assert host_allowed("anything.example", frozenset({"*"}), None)


# ---- Origin and CORS --------------------------------------------------------------------------------


def test_pages_of_other_origins_are_refused_unless_allowed(guarded):
    port = guarded.rsplit(":", 1)[1]
    for origin in ("http://evil.example", "null", f"http://localhost:{port}", "http://127.0.0.1:5556"):
        r = httpx.post(guarded + "/v1/chat/completions", json=CHAT, headers={"Origin": origin, **auth()})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", origin
        assert "access-control-allow-origin" not in r.headers
    same = httpx.post(guarded + "/v1/chat/completions", json=CHAT, headers={"Origin": guarded, **auth()})
    assert same.status_code == 200  # the page's own origin (the playground)
    allowed = httpx.post(guarded + "/v1/chat/completions", json=CHAT, headers={"Origin": ALLOWED_ORIGIN, **auth()})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN


def test_preflights_answer_the_allowed_origins_only(guarded):
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    ok = httpx.options(guarded + "/v1/chat/completions", headers={"Origin": ALLOWED_ORIGIN, **ask})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "authorization" in ok.headers["access-control-allow-headers"].lower()
    other = httpx.options(guarded + "/v1/chat/completions", headers={"Origin": "http://evil.example", **ask})
    assert other.status_code >= 400 and "access-control-allow-origin" not in other.headers
    # A key-less error still carries the CORS header, so the page can read why.
    unauthorized = httpx.get(guarded + "/v1/models", headers={"Origin": ALLOWED_ORIGIN})
    assert unauthorized.status_code == 401 and unauthorized.headers["access-control-allow-origin"] == ALLOWED_ORIGIN


def test_no_cors_by_default(tiny_model):
    with serve_in_thread(tiny_model, ServerConfig(model_name="tiny")) as base:
        ask = {"Origin": "http://127.0.0.1:5555", "Access-Control-Request-Method": "POST"}
        r = httpx.options(base + "/v1/chat/completions", headers=ask)
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        assert httpx.get(base + "/v1/models", headers={"Origin": base}).status_code == 200  # no key set


# ---- keys ---------------------------------------------------------------------------------------------


def test_any_configured_key_passes_and_a_wrong_key_reveals_no_route(guarded):
    for key in KEYS:
        assert openai.OpenAI(base_url=guarded + "/v1", api_key=key, max_retries=0).models.list().data[0].id == "tiny"
    ant = anthropic.Anthropic(base_url=guarded, api_key=KEYS[0], max_retries=0)
    assert ant.messages.create(**MESSAGE).type == "message"  # x-api-key
    for method, path in [("GET", "/v1/nope"), ("DELETE", "/v1/models"), ("GET", "/nope"), ("POST", "/v1/models")]:
        for headers in ({}, auth("key-three"), auth(KEYS[0].upper())):  # absent, wrong, wrong case: 401
            r = httpx.request(method, guarded + path, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
    assert httpx.get(guarded + "/v1/nope", headers=auth()).status_code == 404  # with a key: the truth
    wrong = httpx.post(guarded + "/v1/messages", json=MESSAGE, headers={"x-api-key": "no"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    for path in ("/health", "/", "/playground/main.js", "/openapi.json", "/docs"):  # open: no data in them
        assert httpx.get(guarded + path).status_code == 200, path


def test_keys_from_the_environment_and_a_file(tmp_path, monkeypatch):
    file = tmp_path / "keys"
    file.write_text("# team keys\nalpha\n\n  beta  \n")
    monkeypatch.setenv("COREAI_API_KEY", "gamma, delta")
    args = argparse.Namespace(api_key="cli", api_key_file=file)
    assert api_keys(args) == ("cli", "gamma", "delta", "alpha", "beta")
    monkeypatch.delenv("COREAI_API_KEY")
    file.write_text("# none\n")
    with pytest.raises(InputError, match="no key"):
        api_keys(argparse.Namespace(api_key=None, api_key_file=file))
    with pytest.raises(InputError, match="api-key-file"):
        api_keys(argparse.Namespace(api_key=None, api_key_file=tmp_path / "missing"))
