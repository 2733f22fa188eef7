"""Smoke test of `python -m benchmarks.guided`: the bench runs and writes its JSON (not how fast)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SHARED_DATA


@pytest.mark.skipif(
    not (SHARED_DATA / "jsonschemabench" / "maskbench").is_dir(), reason=f"MaskBench data not found at {SHARED_DATA}"
)
def test_guided_bench_quick(tmp_path, qwen_dir):
    from benchmarks import guided as bench

    out = tmp_path / "bench.json"
    report = bench.main(["--quick", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["machine"]["versions"]["llguidance"]
    qwen = report["vocabs"]["qwen"]
    assert qwen["vocab_size"] == 151_936
    assert qwen["ours"]["counts"]["tokens"] > 0
    for key in ("fill", "apply", "accept", "raw_fill", "raw_accept"):
        assert qwen["ours"]["per_token_us"][key]["n"] == qwen["ours"]["counts"]["tokens"]
    assert out.with_suffix(".md").read_text().startswith("Guided benchmark")


def test_scaling_bench_quick(tmp_path, qwen_dir):
    """`python -m benchmarks.scaling --quick` runs without matplotlib and writes every axis (not how fast)."""
    from benchmarks import scaling

    out = tmp_path / "scaling.json"
    scaling.main(["--quick", "--no-plot", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["machine"]["versions"]["llguidance"] and saved["plot"].startswith("skipped")
    qwen = saved["vocabs"]["qwen"]
    assert qwen["vocab_size"] == 151_936
    assert set(qwen["points"]) == {"properties", "depth", "enum"}
    for axis, points in qwen["points"].items():
        assert [p["x"] for p in points] == scaling.QUICK_AXES[axis]
        for p in points:
            assert p["tokens"] > 0
            assert all(v > 0 for v in p["compile_ms"].values())
            assert all(p["per_token_us"][k]["mean"] > 0 for k in scaling.TOKEN_KEYS)
    assert out.with_suffix(".md").read_text().startswith("Scaling benchmark")
    assert not out.with_suffix(".png").exists()


def test_scaling_cases_are_valid():
    """The synthetic instances are valid against their schemas, in the sizes the axes name."""
    import jsonschema

    from benchmarks import scaling
    from conformance.common import serialize

    for axis, make in scaling.CASES.items():
        for x in scaling.AXES[axis][:3]:
            schema, value = make(x)
            jsonschema.validate(value, schema)
    assert len(scaling.properties_case(16)[0]["required"]) == 16
    assert len(scaling.enum_case(128)[0]["properties"]["choice"]["enum"]) == 128
    assert serialize(scaling.depth_case(3)[1]) == '{"child":{"child":{"value":"x"}}}'


def test_outlines_vocabulary_bytes():
    """The hub-free outlines-core vocabulary maps byte-level and SentencePiece spellings to bytes."""
    pytest.importorskip("outlines_core")
    from benchmarks.guided import _byte_decoder

    dec = _byte_decoder()
    assert len(dec) == 256 and bytes(dec[c] for c in "Ġhello") == b" hello"


def test_speculative_bench_tiny(tiny_model):
    """The speculative bench runs a guided case and a free-prose case on the tiny model and reports the
    speculative outputs identical to the non-speculative ones, with its counters (not how fast)."""
    from benchmarks.generation import format_guided_table, mismatches, run_guided_bench
    from benchmarks.guided import speculative_markdown
    from conformance.common import machine

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    prompt = "Copy the city: Berlin Berlin Berlin Berlin."
    report = run_guided_bench(
        tiny_model, [(prompt, schema, 24), (prompt, None, 16)], 24, 2, speculative="prompt_lookup"
    )
    guided, prose = report["cases"]
    assert report["speculative"] == "prompt_lookup" and not mismatches(report)
    assert set(guided["median"]) == {
        "unconstrained",
        "mlx_lm",
        "jump_forward",
        "jump_forward+spec",
        "unconstrained+spec",
    }
    assert set(prose["median"]) == {"unconstrained", "mlx_lm", "unconstrained+spec"} and prose["max_tokens"] == 16
    assert guided["identical"] == {"jump_forward+spec": True, "unconstrained+spec": True}
    assert prose["identical"] == {"unconstrained+spec": True}
    spec = guided["median"]["jump_forward+spec"]
    assert spec["accepted_tokens"] <= spec["drafted_tokens"] and 0 <= spec["acceptance"] <= 1
    assert guided["ratios"]["jump_forward+spec"]["decode_tps"].keys() >= {"jump_forward", "unconstrained", "mlx_lm"}
    assert "identical" in format_guided_table(report) and "MISMATCH" not in format_guided_table(report)
    assert "| jump_forward+spec |" in speculative_markdown(report, machine(), 1.0)


def test_speculative_cases_match_the_demo():
    """The fly_to case is the demo's call: same schema, same chat messages; every case file parses."""
    from benchmarks.guided import SPECULATIVE_CASES, speculative_cases
    from coreai.commands.demo import FLY_TO, INSTRUCTION, SYSTEM

    cases = dict(zip(SPECULATIVE_CASES, speculative_cases(), strict=False))
    messages, schema, _ = cases["fly_to"]
    assert schema == FLY_TO and messages == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": INSTRUCTION},
    ]
    assert len(cases["invoice"][1]["required"]) >= 5 and cases["story"][1] is None


def test_server_bench_steady_window_leaves_out_the_tail():
    """The steady-state figure counts only the chunks that arrived while every request of the level
    was in flight: here 4 requests at concurrency 2, the last one starting at t=4.6 and the first end
    after it at t=6; each request sends 4 tokens, one per chunk."""
    from benchmarks.server import steady_tps, steady_window

    def request(start, times):
        return {"start": start, "end": times[-1], "chunk_times": times, "completion_tokens": len(times)}

    results = [
        request(0.0, [1.0, 2.0, 3.0, 4.0]),
        request(0.1, [1.5, 2.5, 3.5, 4.5]),
        request(4.0, [5.0, 5.5, 5.8, 6.0]),
        request(4.6, [7.0, 8.0, 9.0, 10.0]),
    ]
    assert steady_window(results, 2) == (0.1, 6.0)
    # Inside [0.1, 6.0]: all of the first three requests (12 chunks), none of the last one.
    assert steady_tps(results, 2) == pytest.approx(12 / 5.9)


def test_speculative_step_split_tiny(tiny_model):
    """The step split times every part of a guided speculative generation on the tiny model: the
    parts add up to the whole, one draft length per step (not how fast)."""
    from benchmarks.speculative import PARTS, split_markdown, step_split
    from conformance.common import machine

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    split = step_split(tiny_model, "Copy the city: Berlin Berlin Berlin Berlin.", schema, 16)
    assert list(split["parts"]) == list(PARTS) and split["steps"] == len(split["draft_lengths"]) >= 1
    assert sum(p["share"] for p in split["parts"].values()) == pytest.approx(1.0)
    assert all(p["seconds"] >= 0 for p in split["parts"].values()) and split["parts"]["forward"]["seconds"] > 0
    split.update(case="city", loadavg=(0.0, 0.0, 0.0))
    assert "| forward |" in split_markdown(split, machine())


def test_distributed_bench_decode_window_starts_when_every_row_has_a_token():
    """The decode window opens at the event where the last row gets its first token; only the tokens
    after it count (here rows 0 and 1 start at events 0 and 1, then 2 + 1 tokens follow)."""
    from benchmarks.distributed import _decode_window

    events = [(1.0, [1, 0]), (2.0, [1, 1]), (3.0, [1, 1]), (4.0, [0, 1])]
    assert _decode_window(events, 2) == (2.0, 1, 3)
    with pytest.raises(RuntimeError, match="no token"):
        _decode_window([(1.0, [1, 0])], 2)


def test_link_delay_shim_holds_each_send(tmp_path):
    """benchmarks/link_delay.c, preloaded, holds every send() for COREAI_LINK_DELAY_US before it goes
    (a lower bound, which the shim guarantees), and the bytes arrive unchanged."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if shutil.which("gcc") is None:  # the benchmark builds the shim only where gcc exists (and says so)
        pytest.skip("no gcc: the shim is built from source (every machine of this project's kind has gcc)")
    shim = tmp_path / "link_delay.so"
    source = Path(__file__).parent.parent / "benchmarks" / "link_delay.c"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(source), "-ldl"], check=True)
    script = (
        "import socket, time\n"
        "a, b = socket.socketpair()\n"
        "t = time.perf_counter(); a.send(b'plan'); a.send(b'step'); took = time.perf_counter() - t\n"
        "print(took, b.recv(8).decode())\n"
    )
    env = {"LD_PRELOAD": str(shim), "COREAI_LINK_DELAY_US": "3000", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    took, data = out.split()
    assert float(took) >= 2 * 0.003 and data == "planstep"


def test_distributed_bench_runs_both_engines_on_real_ranks(tmp_path, tiny_model_dir):
    """`python -m benchmarks.distributed` on the tiny model: 1 rank and 2 tensor-parallel ranks (real
    processes pinned to a core each; in network namespaces with a 50 us link delay when root), coreai
    and mlx-lm back to back, 2 concurrent requests of 4 tokens: every rank reports, both engines decode
    the same number of tokens, and a delayed link shows in the collectives (not how fast)."""
    from benchmarks.distributed import main

    out = tmp_path / "distributed.json"
    main(["--model", str(tiny_model_dir), "--tokens", "4", "--batches", "2", "--modes", "tensor", "--delays", "50",
          "--repeats", "1", "--out", str(out)])  # fmt: skip
    runs = json.loads(out.read_text())["runs"]
    assert [(r["engine"], r["setting"]) for r in runs] == [
        ("coreai", "1 rank"), ("mlx-lm", "1 rank"), ("coreai", "tensor"), ("mlx-lm", "tensor")
    ]  # fmt: skip
    for run in runs:
        ranks = run["ranks"]
        assert [r["rank"] for r in ranks] == list(range(len(ranks)))
        assert ranks[0]["tokens"] == 2 * 3 and ranks[0]["decode_tps"] > 0  # 2 rows x 3 tokens after the first
        if run["setting"] == "tensor":
            assert len(ranks) == 2 and all(r["peak_rss_mib"] > 0 for r in ranks)
            if run["delay_by"] == "loopback":  # not root: no namespaces, no delay
                assert run["delay_us"] == 0
            else:  # 2 layers x 2 all-reduces, each waiting >= 50 us for the other rank's data
                assert run["delay_us"] == 50 and ranks[0]["collectives_ms"] >= 4 * 0.05
