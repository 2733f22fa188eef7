"""The OpenAI Responses dialect: `POST /v1/responses` and the stored responses' routes (`routes`),
its bodies (`schemas`), mapping (`request`), event stream (`stream`), store (`store`) and the same
requests over a WebSocket (`websocket`). It shares the OpenAI family's types through
`coreai.server.openai.family` only. `DIALECT`: what the shell needs of it."""

from fastapi import FastAPI

from coreai.server.dialect import Dialect
from coreai.server.responses import routes, websocket


def _install(app: FastAPI) -> None:
    routes.install(app)
    websocket.install(app)  # after `routes.install`: it uses the app's store


# Its errors are the shell's default shape (OpenAI's); its tools' union tags (the tag of hosted tools
# is "hosted"; input items' tags are capitalised, which the field path skips anyway).
DIALECT = Dialect(
    install=_install,
    streaming_paths=("/v1/responses",),
    union_tags=frozenset({"namespace", "local_shell", "hosted"}),
)
