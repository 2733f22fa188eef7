"""The OpenAI dialect: chat completions and legacy completions (`routes`), their request bodies
(`schemas`), mapping into the service's request (`request`), reply shapes (`reply_schemas`) and
renderers (`reply`, `tools`, the `provenance` stream extension). `family` is the one module the
Responses dialect may import from here. `DIALECT`: what the shell needs of it."""

from fastapi import FastAPI

from coreai.server.dialect import Dialect
from coreai.server.openai import routes


def _install(app: FastAPI) -> None:
    app.include_router(routes.router)


# Its errors are the shell's default shape (OpenAI's); the discriminator values of its request
# unions (message roles, content parts, response formats) are never field names.
DIALECT = Dialect(
    install=_install,
    streaming_paths=("/v1/chat/completions", "/v1/completions"),
    union_tags=frozenset({"system", "developer", "user", "assistant", "tool", "text", "json_object", "json_schema"}),
)
