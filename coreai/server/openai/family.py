"""What the OpenAI family shares with the Responses dialect, declared in one place: the Responses
dialect imports these from here and nothing else of `coreai.server.openai` (what every dialect maps
alike, roles, sampling, calls in the template's shape, tool pairing, is `coreai.service.chat`'s)."""

from coreai.server.openai.reply import chat_logprobs, usage_info
from coreai.server.openai.reply_schemas import TokenLogprob
from coreai.server.openai.request import HINTS, parsed_arguments, reasoning_of, structured_options
from coreai.server.openai.schemas import StructuredOutputs

__all__ = [
    "HINTS",
    "StructuredOutputs",
    "TokenLogprob",
    "chat_logprobs",
    "parsed_arguments",
    "reasoning_of",
    "structured_options",
    "usage_info",
]
