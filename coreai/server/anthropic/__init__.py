"""The Anthropic Messages dialect: `POST /v1/messages`, `count_tokens` and Claude Code's probe
(`routes`), its bodies (`schemas`), mapping (`request`), reply and stream (`reply`) and error shape
(`errors`). `DIALECT`: what the shell needs of it."""

from coreai.server.anthropic import errors, routes
from coreai.server.dialect import Dialect

DIALECT = Dialect(
    install=routes.install,
    error_shapes={errors.PATH: errors.error_response},
    error_schemas={errors.PATH: (errors.ERROR_SCHEMA, ("529",))},  # 529: overloaded, which the SDK retries
    streaming_paths=(errors.PATH,),
    # Its block, tool and thinking tags, and pydantic's label of its content union.
    union_tags=frozenset(
        {"text", "tool_use", "tool_result", "thinking", "redacted_thinking", "custom", "client", "server", "enabled"}
        | {"adaptive", "disabled", "image", "document", "list[union[text,image]]"}
    ),
    models=routes.MODELS,
)
