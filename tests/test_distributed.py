"""One model across two real ranks on loopback (MLX's ring backend, free ports): `coreai serve` and
`coreai generate` under `mlx.launch` give, greedy, byte for byte what one process gives (a schema
request, a tool call, a stream on chat completions, Responses and Messages; tensor and pipeline
parallel); a stream cancelled mid-way leaves both
ranks serving; a model that cannot split is refused at start; a killed rank ends the server (503,
then exit code 3) within a bound.

The tiny random model serves every case but one real-model case (marked `model`). Each launch costs
a few seconds of start-up (both ranks import and load), so the servers are shared per module.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
from coreai.cli import main
from coreai.server import ServerConfig
from coreai.server.background import serve_in_thread
from runtime.distributed import EXIT_LOST

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = str(Path(sys.executable).parent / "mlx.launch")
START_TIMEOUT = 180.0  # seconds for both ranks to import, load and serve on a busy 2-core machine
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "set_unit",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "note": {"type": "string", "maxLength": 8}},
                "required": ["unit", "note"],
            },
        },
    }
]
USER = [{"role": "user", "content": "Tell me about a person."}]
SERVE = ["--grammar-journal", "off", "--temperature", "0", "--max-tokens", "480", "--whitespace", "compact"]


def _free_ports(n: int) -> int:
    """The first of `n` consecutive free loopback ports (mlx.launch's ring takes start, start + 1, ...)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            start = s.getsockname()[1]
        try:
            with contextlib.ExitStack() as stack:
                for port in range(start, start + n):
                    stack.enter_context(socket.create_server(("127.0.0.1", port)))
            return start
        except OSError:
            continue
    raise RuntimeError("no free ports")


def _env() -> dict:
    """This checkout first on every rank's path (the editable install may point elsewhere)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def launch(args: list[str], ranks: int = 2, **popen) -> subprocess.Popen:
    """`mlx.launch --hosts 127.0.0.1 -n RANKS -- -m coreai ARGS` (ring backend, free ports)."""
    cmd = [LAUNCH, "--python", sys.executable, "--hosts", "127.0.0.1", "-n", str(ranks)]
    cmd += ["--starting-port", str(_free_ports(ranks)), "--", "-m", "coreai", *args]
    return subprocess.Popen(cmd, env=_env(), cwd=ROOT, text=True, **popen)


def _wait_up(base: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        assert process.poll() is None, "the ranks ended before serving"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise AssertionError("the distributed server did not start")


def _ranks(launcher: int) -> dict[int, int]:
    """{rank: pid} of the launcher's children (mlx.launch execs each rank in a child shell)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == launcher:
                env = (stat.parent / "environ").read_bytes().split(b"\0")
                rank = next(int(e[9:]) for e in env if e.startswith(b"MLX_RANK="))
                found[rank] = int(stat.parent.name)
    return found


@contextlib.contextmanager
def distributed_server(model_dir: Path, *extra: str) -> Iterator[str]:
    """`coreai serve` on two ranks under mlx.launch; yields its base URL; stops it with SIGTERM to
    rank 0 (its orderly shutdown releases rank 1) and checks every rank ended."""
    port = _free_ports(1)
    process = launch(["serve", str(model_dir), "--port", str(port), *SERVE, *extra])
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_up(base, process)
        yield base
        os.kill(_ranks(process.pid)[0], signal.SIGTERM)
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


def answers(base: str) -> dict:
    """The greedy answers compared: three requests decoded together, a schema request, a tool call and
    a stream on chat completions, a schema request on Responses, a forced tool call on Messages."""
    c = client(base)
    name = c.models.list().data[0].id
    schema = c.chat.completions.create(
        model=name,
        messages=USER,
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
    ).choices[0]
    tool = c.chat.completions.create(model=name, messages=USER, max_tokens=60, tools=TOOLS, tool_choice="required")
    call = tool.choices[0].message.tool_calls[0].function
    stream = c.chat.completions.create(model=name, messages=USER, max_tokens=40, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    response = c.responses.create(
        model=name,
        input=USER,
        max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}},
    )
    f = TOOLS[0]["function"]
    message = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0).messages.create(
        model=name,
        max_tokens=60,
        messages=USER,
        tools=[{"name": f["name"], "input_schema": f["parameters"]}],
        tool_choice={"type": "any"},
    )
    return {
        "batched": _batched(c, name),
        "responses": (response.output_text, response.status),
        "messages": ([block.model_dump(exclude={"id"}) for block in message.content], message.stop_reason),
        "schema": (schema.message.content, schema.finish_reason),
        "tool": (call.name, call.arguments, tool.choices[0].finish_reason),
        "stream": text,
    }


def _batched(c: openai.OpenAI, name: str) -> list[str]:
    """Three requests sent together, so they decode in one batch (continuous batching): their texts."""
    prompts = ["Tell me about a person.", "Name a city.", "Count to five."]

    def ask(prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        reply = c.chat.completions.create(model=name, messages=messages, max_tokens=30, temperature=0)
        return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(ask, prompts))


@pytest.fixture(scope="module")
def one_process(tiny_model) -> dict:
    config = ServerConfig(temperature=0.0, max_tokens=480, whitespace="compact")
    with serve_in_thread(tiny_model, config) as base:
        return answers(base)


@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_serve_matches_one_process(tiny_model_dir, one_process, mode):
    with distributed_server(tiny_model_dir, *(["--pipeline"] if mode == "pipeline" else [])) as base:
        health = httpx.get(base + "/health").json()
        assert health["distributed"] == {"ranks": 2, "mode": mode}
        assert answers(base) == one_process
        if mode == "tensor":
            _cancel_mid_stream(base, one_process)


def _cancel_mid_stream(base: str, one_process: dict) -> None:
    """A client leaving mid-stream cancels its row on every rank (a `leave` in the next plan): the
    next requests get the same answers, and nothing is left running."""
    body = {"model": client(base).models.list().data[0].id, "messages": USER, "max_tokens": 450, "stream": True}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i == 5:
                break  # leave with the generation under way
    assert answers(base) == one_process
    assert httpx.get(base + "/health").json()["running"] == 0


def test_generate_matches_one_process(tiny_model_dir, capsys):
    args = ["generate", str(tiny_model_dir), "--prompt", "Tell me about a person.", "--max-tokens", "40"]
    args += ["--schema", json.dumps(SCHEMA), "--whitespace", "compact"]
    assert main(args) == 0
    alone = capsys.readouterr().out
    done = launch(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = done.communicate(timeout=START_TIMEOUT)
    assert out == alone, err  # rank 0 prints the answer; rank 1 prints nothing
    assert "exited with code" not in err  # mlx.launch reports a rank that failed


def test_the_output_head_is_split_by_vocabulary_rows(
    tiny_model_dir, tmp_path, write_tiny_tokenizer, write_tiny_network
):
    """On 2 ranks, tensor and pipeline, each rank computes the logits of its half of the vocabulary
    (an untied `lm_head`, which keeps only those rows, and a head tied to the embeddings, which stay
    whole), and the gathered logits are the one process's (`runtime.distributed.split_head`)."""
    tied = tmp_path / "tied"
    tied.mkdir()
    write_tiny_tokenizer(tied)
    write_tiny_network(tied, "qwen2", tie_word_embeddings=True)
    cmd = [LAUNCH, "--python", sys.executable, "--hosts", "127.0.0.1", "-n", "2", "--starting-port"]
    cmd += [str(_free_ports(2)), "--", "-m", "tests.distributed_head", str(tiny_model_dir), str(tied)]
    done = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=START_TIMEOUT)
    checks = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("HEAD ")]
    assert len(checks) == 2 * 2 * 2, done.stderr[-3000:]  # ranks x modes x folders
    vocab = json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    for rank, mode, folder, start, stop, held, diff in checks:
        half = vocab // 2
        assert (int(start), int(stop)) == (int(rank) * half, (int(rank) + 1) * half), (mode, folder)
        assert int(held) == (vocab if folder == "tied" else half), (rank, mode, folder)
        assert float(diff) < 1e-4, (rank, mode, folder, diff)


def test_a_head_the_architecture_already_split_is_left_alone():
    """In one process (a group of 1): a plain `lm_head` gets a split of every row that gives the head's
    own logits (the call path and shapes; the gather's order across ranks is the 2-rank test's); a
    head mlx-lm's `shard` already split (an `AllToShardedLinear`, as qwen3_5's) is not split again."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.nn.layers.distributed import AllToShardedLinear

    from runtime.distributed import head_split, split_head

    group = mx.distributed.init()
    x = mx.random.normal((2, 3, 8))
    network = nn.Module()
    network.lm_head = nn.Linear(8, 12, bias=False)
    expected = network.lm_head(x)
    split = split_head(network, group)
    assert split is not None and split.rows == (0, 12) and head_split(network) is split
    assert mx.array_equal(network.lm_head(x), expected)
    network.lm_head = AllToShardedLinear(8, 12, bias=False, group=group)
    assert split_head(network, group) is None and head_split(network) is None


def test_a_model_that_cannot_split_is_refused(tiny_model_dir):
    """The tiny model's 4 heads do not split across 3 ranks: every rank says so and ends, before any
    collective (the pipeline's check, fewer layers than ranks, is the same path)."""
    args = ["generate", str(tiny_model_dir), "--prompt", "hi", "--max-tokens", "2"]
    done = launch(args, ranks=3, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = done.communicate(timeout=START_TIMEOUT)
    assert "num_attention_heads = 4 is not divisible by 3 ranks" in err and "Traceback" not in err


def test_a_killed_rank_ends_the_server(tiny_model_dir):
    """Rank 1 killed mid-request: rank 0 answers 503 and exits with code 3 within the bound (rank
    timeout + a heartbeat period + the grace). The ranks are started as mlx.launch starts them
    (MLX_RANK, MLX_HOSTFILE) but without it: mlx.launch itself ends the other ranks when one dies,
    which would hide rank 0's own handling."""
    timeout, port, ring = 4.0, _free_ports(1), _free_ports(2)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as hosts:
        json.dump([[f"127.0.0.1:{ring}"], [f"127.0.0.1:{ring + 1}"]], hosts)
    args = [sys.executable, "-m", "coreai", "serve", str(tiny_model_dir), "--port", str(port), *SERVE]
    args += ["--rank-timeout", str(timeout)]
    ranks = [
        subprocess.Popen(args, env={**_env(), "MLX_RANK": str(r), "MLX_HOSTFILE": hosts.name}, cwd=ROOT) for r in (0, 1)
    ]
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_up(base, ranks[0])
        body = {"model": client(base).models.list().data[0].id, "messages": USER, "max_tokens": 450, "stream": True}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(lines)
            ranks[1].kill()
            killed = time.monotonic()
            list(lines)  # the stream ends (cut, or with an error event), it does not hang
        statuses = set()
        with contextlib.suppress(httpx.HTTPError):
            while ranks[0].poll() is None:
                statuses.add(httpx.get(base + "/health", timeout=2).status_code)
                time.sleep(0.1)
        assert ranks[0].wait(timeout + 30) == EXIT_LOST
        assert time.monotonic() - killed < timeout + timeout / 4 + 2 + 5  # the bound, and slack
        assert 503 in statuses
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
                r.wait()
        os.unlink(hosts.name)


def test_a_rank_killed_under_mlx_launch_answers_503_at_once(tiny_model_dir):
    """mlx.launch ends every rank (SIGTERM) once one dies, rank 0 too, whose step waits on the dead
    rank (the ring backend does not raise): stopping, rank 0 gives the step a short bound, then answers
    503 `cluster_lost` to the running requests (a stream that began ends with that error event) and
    the ranks end, within seconds, not after the rank timeout (60 s) or a drain that cannot finish."""
    port = _free_ports(1)
    process = launch(["serve", str(tiny_model_dir), "--port", str(port), *SERVE])
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_up(base, process)
        body = {"model": client(base).models.list().data[0].id, "messages": USER, "max_tokens": 480}
        url = base + "/v1/chat/completions"
        with ThreadPoolExecutor(1) as pool, httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as s:
            lines = s.iter_lines()
            next(lines)
            plain = pool.submit(httpx.post, url, json=body, timeout=60)
            time.sleep(0.5)  # the plain request joins the batch
            os.kill(_ranks(process.pid)[1], signal.SIGKILL)
            killed = time.monotonic()
            streamed = list(lines)
            reply = plain.result()
        assert time.monotonic() - killed < 12
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "cluster_lost", reply.text
        assert any('"cluster_lost"' in line for line in streamed), streamed[-3:]
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_stopping_leader_bounds_an_exchange(monkeypatch):
    """Once rank 0 stops (`Leader.stopping`), an exchange that outlasts the short bound counts as the
    cluster lost, well before the rank timeout: a rank that hangs (not dies) cannot hold a stop. The
    exchange is made slow at the channel (a boundary: a hung rank cannot be made on demand; a dead
    one under mlx.launch is the test above)."""
    import mlx.core as mx

    from runtime import distributed

    lost: list[str] = []
    leader = distributed.Leader(distributed.Cluster(mx.distributed.init(), "tensor", timeout=60), lost.append)
    monkeypatch.setattr(distributed._Channel, "send", lambda self, message: time.sleep(1.5))
    leader.heartbeat()
    assert lost == []  # 1.5 s is within the rank timeout
    leader.stopping(0.5)
    leader.heartbeat()
    assert len(lost) == 1 and "a heartbeat took longer than 0.5 s" in lost[0]


@pytest.mark.model
def test_real_model_schema_request_matches_one_process(qwen_dir, qwen_model):
    body = dict(
        messages=[{"role": "user", "content": "Give me a person named Ada, aged 36."}],
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
    )
    with serve_in_thread(qwen_model, ServerConfig(temperature=0.0, whitespace="compact")) as base:
        c = client(base)
        alone = c.chat.completions.create(model=c.models.list().data[0].id, **body).choices[0].message.content
    with distributed_server(qwen_dir) as base:
        c = client(base)
        assert c.chat.completions.create(model=c.models.list().data[0].id, **body).choices[0].message.content == alone
