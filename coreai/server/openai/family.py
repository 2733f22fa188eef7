"""What the OpenAI family shares with the Responses dialect, declared in one place: the Responses
dialect imports these from here and nothing else of `coreai.server.openai`."""

from coreai.server.openai.replies import chat_logprobs, usage_info
from coreai.server.openai.reply_schemas import TokenLogprob
from coreai.server.openai.request import (
    HINTS,
    REASONING_BUDGETS,
    reasoning_of,
    sampling_of,
    structured_options,
    template_call,
    template_custom_call,
)
from coreai.server.openai.schemas import StructuredOutputs

__all__ = [
    "HINTS",
    "REASONING_BUDGETS",
    "StructuredOutputs",
    "TokenLogprob",
    "chat_logprobs",
    "reasoning_of",
    "sampling_of",
    "structured_options",
    "template_call",
    "template_custom_call",
    "usage_info",
]
