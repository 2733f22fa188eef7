"""The JSON Schema toolkit the guided compiler works with, one job per module:

- `pointer`: JSON pointers (RFC 6901) and local `$ref`s: format, parse, resolve;
- `walk`: the subschemas of a schema (through its applicator keywords) and the nodes of a document;
- `checks`: static checks before compiling (depth, metaschema, property-name patterns, finiteness);
- `rewrite`: schema-to-schema rewrites before compiling (strict mode's closed objects, exact and
  bounded formats);
- `numbers`: numbers as exact decimals, for the final check and for what the engine is given.
"""
