"""`verify`: check that an exported folder computes the right thing, with mlx-lm's own loader.

Three checks:
1. Perplexity on a fixed English paragraph shipped with the package (`recipes/data/paragraph.txt`,
   51 words) is below `max_perplexity`. Right exports of the 0.3-0.5B models score about 7-15;
   a wrong weight map or a dropped BOS gives hundreds or thousands.
2. Greedy decoding of a fixed prompt contains the expected answer: with a chat template,
   "What is the capital of France? Answer in one word." -> "Paris"; without one (a base model),
   "The capital of France is the city of" -> " Paris" (a 270M base model
   continues the shorter "The capital of France is" with " the").
3. With `reference` (the float export of the same model), the top-1 token at each position of the
   paragraph agrees with the reference at a fraction >= `min_agreement` (default 0.75; measured on
   the Qwen 0.5B over the 54-token paragraph: 4 bits 0.815 at group size 64 and 0.870 at 32;
   8 bits 0.963 at 64). A quantized export made with `--verify` is compared with its own float
   weights, taken before quantization (`float_reference`), so no second export is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import cast

from .errors import ExportError

DEFAULT_MAX_PERPLEXITY = 50.0
DEFAULT_MIN_AGREEMENT = 0.75
CHAT_PROMPT = "What is the capital of France? Answer in one word."
PLAIN_PROMPT = "The capital of France is the city of"
EXPECT = "Paris"


def paragraph() -> str:
    """The fixed English paragraph used for perplexity (shipped as package data)."""
    return resources.files("recipes").joinpath("data/paragraph.txt").read_text(encoding="utf-8").strip()


@dataclass
class VerifyReport:
    """Results of `verify`: `perplexity` = exp(mean NLL in nats over `tokens` - 1 predicted
    positions), the greedy `answer` to `prompt`, top-1 `agreement` with a reference (or None),
    and the `failures` (empty when all checks passed)."""

    folder: Path
    perplexity: float
    tokens: int
    prompt: str
    answer: str
    agreement: float | None = None
    failures: list[str] = field(default_factory=list)
    reference_perplexity: float | None = None  # of the unquantized weights, when compared

    @property
    def passed(self) -> bool:
        return not self.failures

    def record(self) -> dict:
        """The results as coreai.json records them (JSON types; the folder left out)."""
        return {
            "passed": self.passed,
            "perplexity": self.perplexity,
            "tokens": self.tokens,
            "prompt": self.prompt,
            "answer": self.answer,
            "agreement": self.agreement,
            "failures": list(self.failures),
        }

    def summary(self) -> str:
        parts = [f"perplexity {self.perplexity:.2f} on {self.tokens} tokens", f"answer {self.answer.strip()[:40]!r}"]
        if self.reference_perplexity is not None:
            parts.append(f"unquantized perplexity {self.reference_perplexity:.2f}")
        if self.agreement is not None:
            parts.append(f"top-1 agreement {self.agreement:.3f}")
        return ("passed: " if self.passed else "FAILED: ") + ", ".join(parts + self.failures)


def load_for_eval(folder: str | Path, tokenizer: bool = True):
    """(model, tokenizer or None) from mlx-lm's loader (`tokenizer=False` skips the tokenizer,
    which takes seconds for a 262k vocabulary).

    On the CPU, quantized layers are dequantized (exactly the values the quantized kernels use) and
    float weights cast to float32: MLX's CPU quantized and float16 matmuls have no BLAS path and
    are 10-100x slower (a 4-bit 0.5B check took 134 s instead of ~10 s).
    """
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import dequantize_model, load_model, load_tokenizer

    from runtime.rope import apply_untruncated_yarn

    model, config = load_model(Path(folder))
    apply_untruncated_yarn(model, config)  # as coreai.load does (gpt-oss)
    if mx.default_device() == mx.cpu:
        model = dequantize_model(model)
        model.update(
            tree_map(lambda p: p.astype(mx.float32) if p.dtype in (mx.float16, mx.bfloat16) else p, model.parameters())
        )
    if not tokenizer:
        return model, None
    return model, load_tokenizer(Path(folder), eos_token_ids=config.get("eos_token_id"))


def logits_for(model, ids: list[int]):
    """logits: mx.array [len(ids), vocab] float32 for one sequence of token ids."""
    import mlx.core as mx

    return model(mx.array(ids)[None])[0].astype(mx.float32)


def nll(model, ids: list[int], logits=None) -> float:
    """Mean negative log-likelihood (nats/token) of ids[1:] given the prefix (`logits`, if given,
    are `logits_for(model, ids)`)."""
    import mlx.core as mx

    logits = (logits_for(model, ids) if logits is None else logits)[:-1]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logprobs, mx.array(ids[1:])[:, None], axis=-1)
    return -cast(float, picked.mean().item())  # mlx types item() as any scalar


def float_reference(model, write_tokenizer, config: dict) -> dict:
    """The unquantized model's predictions on the paragraph, for `verify`: `reference_top1`
    (list[int], argmax at each position) and `reference_perplexity`. The tokenizer is written by
    `write_tokenizer(folder)` into a temporary folder, next to `config` (transformers picks the
    tokenizer class from its model_type), and loaded as `verify` loads it, so both see the same ids."""
    import json
    import tempfile

    import mlx.core as mx
    from mlx_lm.utils import load_tokenizer

    with tempfile.TemporaryDirectory(prefix="coreai-reference-") as folder:
        write_tokenizer(Path(folder))
        Path(folder, "config.json").write_text(json.dumps(config))
        ids = load_tokenizer(Path(folder)).encode(paragraph())
    if len(ids) < 2:
        return {}  # verify reports the broken tokenizer
    logits = logits_for(model, ids)
    return {
        "reference_top1": mx.argmax(logits, axis=-1).tolist(),
        "reference_perplexity": math.exp(nll(model, ids, logits)),
    }


def verify(
    folder: str | Path,
    *,
    max_perplexity: float = DEFAULT_MAX_PERPLEXITY,
    prompt: str | None = None,
    expect: str | None = EXPECT,
    chat: bool | None = None,
    reference: str | Path | None = None,
    min_agreement: float = DEFAULT_MIN_AGREEMENT,
    reference_top1: list[int] | None = None,
    reference_perplexity: float | None = None,
    max_tokens: int = 12,
    check: bool = False,
) -> VerifyReport:
    """Verify the mlx-lm folder `folder` (see the module docstring for the checks).

    Args:
        prompt: the greedy-decoding prompt; default CHAT_PROMPT with a chat template, else PLAIN_PROMPT.
        expect: substring the greedy answer must contain (None: skip the check).
        chat: apply the chat template to `prompt` (default: when the tokenizer has one).
        reference: float export of the same model for the top-1 agreement check.
        reference_top1, reference_perplexity: the same check against predictions already made
            (`float_reference`), instead of a `reference` folder.
        check: raise ExportError (one line, naming the folder) when a check fails.

    Returns VerifyReport. Raises ExportError when `check` and a check fails.
    """
    import mlx.core as mx
    from mlx_lm import generate

    model, tokenizer = load_for_eval(folder)
    ids = tokenizer.encode(paragraph())
    # Fewer than 2 tokens leaves nothing to predict: a broken tokenizer, reported as a failure.
    logits = logits_for(model, ids) if len(ids) >= 2 else None
    perplexity = math.exp(nll(model, ids, logits)) if len(ids) >= 2 else math.inf
    compare = reference is not None or reference_top1 is not None
    top1 = mx.argmax(logits, axis=-1) if compare and logits is not None else None
    if top1 is not None:
        mx.eval(top1)
    del logits

    if chat is None:
        chat = bool(getattr(tokenizer, "chat_template", None))
    if prompt is None:
        prompt = CHAT_PROMPT if chat else PLAIN_PROMPT
    if chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        prompt_ids = tokenizer.encode(prompt)
    answer = generate(model, tokenizer, prompt_ids, max_tokens=max_tokens, verbose=False) if prompt_ids else ""

    report = VerifyReport(Path(folder), perplexity, len(ids), prompt, answer)
    if len(ids) < 2:
        report.failures.append(f"the paragraph encodes to {len(ids)} tokens")
    elif not perplexity <= max_perplexity:
        report.failures.append(f"perplexity {perplexity:.1f} > {max_perplexity}")
    if expect and expect not in answer:
        report.failures.append(f"answer {answer.strip()[:40]!r} lacks {expect!r}")
    report.reference_perplexity = reference_perplexity
    if top1 is not None:
        if reference_top1 is not None:
            ref_top1 = mx.array(reference_top1)
        else:
            del model
            assert reference is not None  # `compare` without reference_top1
            ref_model, _ = load_for_eval(reference, tokenizer=False)
            ref_top1 = mx.argmax(logits_for(ref_model, ids), axis=-1)
        report.agreement = cast(float, (top1 == ref_top1).astype(mx.float32).mean().item())
        if report.agreement < min_agreement:
            report.failures.append(f"top-1 agreement {report.agreement:.3f} < {min_agreement}")
    if check and report.failures:
        raise ExportError(f"{folder}: verification failed: {'; '.join(report.failures)}")
    return report
