"""`make_drafter`: the drafter for a request's `speculative` option (`runtime.speculative`,
`runtime.value_lookup`). Apart from the drafters so that they import one another one way only
(`ValueLookup` builds on `PromptLookup`)."""

from __future__ import annotations

from runtime.errors import InputError
from runtime.speculative import DraftModel
from runtime.strategy import Drafter
from runtime.value_lookup import ValueLookup


def make_drafter(speculative, model) -> Drafter | None:
    """The drafter for a `speculative` option: None / False / "off" (no speculation),
    "prompt_lookup" (`runtime.value_lookup.ValueLookup` with the model's tokenizer: prompt lookup
    with text-level drafts at JSON string values), "draft" (the target's `model.draft`), or a
    `runtime.Model` to draft with.

    Raises ValueError for an unknown option, a missing draft model, or a draft model whose
    vocabulary differs from the target's."""
    if speculative in (None, False, "off", "none"):
        return None
    if speculative == "prompt_lookup":
        return ValueLookup(model.tokenizer)
    if speculative == "draft":
        speculative = getattr(model, "draft", None)
        if speculative is None:
            raise InputError('speculative="draft" needs a draft model: coreai.load(..., draft=NAME)')
    if isinstance(speculative, str) or not hasattr(speculative, "network"):
        raise InputError(f'speculative must be "prompt_lookup", "draft", a Model or None, got {speculative!r}')
    if speculative.tokenizer.hf.get_vocab() != model.tokenizer.hf.get_vocab():
        raise InputError(f"the draft model {speculative.name} does not share the target's tokenizer")
    return DraftModel(speculative)
