"""Smoke test of `python -m benchmarks.guided`: the bench runs and writes its JSON (not how fast)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SHARED_DATA


@pytest.mark.skipif(not (SHARED_DATA / "jsonschemabench" / "maskbench").is_dir(),
                    reason=f"MaskBench data not found at {SHARED_DATA}")
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


def test_outlines_vocabulary_bytes():
    """The hub-free outlines-core vocabulary maps byte-level and SentencePiece spellings to bytes."""
    pytest.importorskip("outlines_core")
    from benchmarks.guided import _byte_decoder

    dec = _byte_decoder()
    assert len(dec) == 256 and bytes(dec[c] for c in "Ġhello") == b" hello"
