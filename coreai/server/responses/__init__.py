"""The OpenAI Responses dialect: `POST /v1/responses` and the stored responses' routes (`routes`),
its bodies (`schemas`), mapping (`request`), event stream (`stream`) and store (`store`). It shares
the OpenAI family's types through `coreai.server.openai.family` only."""
