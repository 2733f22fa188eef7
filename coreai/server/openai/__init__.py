"""The OpenAI dialect: chat completions and legacy completions (`routes`), their request bodies
(`schemas`), mapping into the service's request (`request`), reply shapes (`reply_schemas`) and
renderers (`replies`, `tools`, the `provenance` stream extension). `family` is the one module the
Responses dialect may import from here."""
