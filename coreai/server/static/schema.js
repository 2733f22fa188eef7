// JSON Schema documents as the server reads them: the keywords its enforcement report walks
// (guided.enforcement, guided.schema.walk) and JSON pointers.

// Keywords whose value is one subschema / a list of subschemas / a map of name -> subschema
// (guided.schema.walk: SUBSCHEMA, SUBSCHEMA_LIST, SUBSCHEMA_MAP).
const SUBSCHEMA = new Set(["additionalProperties", "items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties"]);
const SUBSCHEMA_LIST = new Set(["allOf", "anyOf", "oneOf", "prefixItems", "items"]);
const SUBSCHEMA_MAP = new Set(["properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"]);

// The keywords of each draft's validator (jsonschema's VALIDATORS; a test compares them), by `$schema`
// without its "#"; a schema naming none (or another) is read as 2020-12, as the server does.
const LATEST = "https://json-schema.org/draft/2020-12/schema";
export const DRAFTS = {
  "http://json-schema.org/draft-03/schema": ["$ref", "additionalItems", "additionalProperties", "dependencies", "disallow", "divisibleBy", "enum", "extends", "format", "items", "maxItems", "maxLength", "maximum", "minItems", "minLength", "minimum", "pattern", "patternProperties", "properties", "type", "uniqueItems"],
  "http://json-schema.org/draft-04/schema": ["$ref", "additionalItems", "additionalProperties", "allOf", "anyOf", "dependencies", "enum", "format", "items", "maxItems", "maxLength", "maxProperties", "maximum", "minItems", "minLength", "minProperties", "minimum", "multipleOf", "not", "oneOf", "pattern", "patternProperties", "properties", "required", "type", "uniqueItems"],
  "http://json-schema.org/draft-06/schema": ["$ref", "additionalItems", "additionalProperties", "allOf", "anyOf", "const", "contains", "dependencies", "enum", "exclusiveMaximum", "exclusiveMinimum", "format", "items", "maxItems", "maxLength", "maxProperties", "maximum", "minItems", "minLength", "minProperties", "minimum", "multipleOf", "not", "oneOf", "pattern", "patternProperties", "properties", "propertyNames", "required", "type", "uniqueItems"],
  "http://json-schema.org/draft-07/schema": ["$ref", "additionalItems", "additionalProperties", "allOf", "anyOf", "const", "contains", "dependencies", "enum", "exclusiveMaximum", "exclusiveMinimum", "format", "if", "items", "maxItems", "maxLength", "maxProperties", "maximum", "minItems", "minLength", "minProperties", "minimum", "multipleOf", "not", "oneOf", "pattern", "patternProperties", "properties", "propertyNames", "required", "type", "uniqueItems"],
  "https://json-schema.org/draft/2019-09/schema": ["$recursiveRef", "$ref", "additionalItems", "additionalProperties", "allOf", "anyOf", "const", "contains", "dependentRequired", "dependentSchemas", "enum", "exclusiveMaximum", "exclusiveMinimum", "format", "if", "items", "maxItems", "maxLength", "maxProperties", "maximum", "minItems", "minLength", "minProperties", "minimum", "multipleOf", "not", "oneOf", "pattern", "patternProperties", "properties", "propertyNames", "required", "type", "unevaluatedItems", "unevaluatedProperties", "uniqueItems"],
  "https://json-schema.org/draft/2020-12/schema": ["$dynamicRef", "$ref", "additionalProperties", "allOf", "anyOf", "const", "contains", "dependentRequired", "dependentSchemas", "enum", "exclusiveMaximum", "exclusiveMinimum", "format", "if", "items", "maxItems", "maxLength", "maxProperties", "maximum", "minItems", "minLength", "minProperties", "minimum", "multipleOf", "not", "oneOf", "pattern", "patternProperties", "prefixItems", "properties", "propertyNames", "required", "type", "unevaluatedItems", "unevaluatedProperties", "uniqueItems"],
};
// guided.enforcement: keywords checked inside another's validator, and keywords that only hold others.
const ASSERTING = ["then", "else", "minContains", "maxContains"];
const NOT_ASSERTING = new Set(["$defs", "definitions", "$ref", "$dynamicRef", "$recursiveRef", "$schema", "$id"]);

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const isSchema = (v) => isObject(v) || typeof v === "boolean";

/** The JSON pointer (RFC 6901) of a path of keys and indexes: ["a/b", 0] -> "/a~1b/0". */
export function pointer(path) {
  return path.map((p) => "/" + String(p).replaceAll("~", "~0").replaceAll("/", "~1")).join("");
}

/** [path, subschema] of `schema` and every schema nested in it through applicator keywords (depth first). */
function* subschemas(schema, path = []) {
  yield [path, schema];
  if (!isObject(schema)) return;
  for (const [key, value] of Object.entries(schema)) {
    if (SUBSCHEMA.has(key) && isSchema(value)) yield* subschemas(value, [...path, key]);
    else if (SUBSCHEMA_LIST.has(key) && Array.isArray(value)) {
      for (const [i, item] of value.entries()) yield* subschemas(item, [...path, key, i]);
    } else if (SUBSCHEMA_MAP.has(key) && isObject(value)) {
      for (const [name, item] of Object.entries(value)) if (isSchema(item)) yield* subschemas(item, [...path, key, name]);
    }
  }
}

/**
 * Every keyword of `schema` that asserts something, [{keyword, pointer}] in the server's report order
 * (the keywords of its draft; annotations, identifiers and unknown keywords are left out).
 * (A JavaScript object lists integer-like keys first: properties named "1", "2" come first here.)
 */
export function assertingKeywords(schema) {
  const draft = isObject(schema) && typeof schema.$schema === "string" ? DRAFTS[schema.$schema.replace(/#$/, "")] : null;
  const known = new Set([...(draft || DRAFTS[LATEST]), ...ASSERTING]);
  const found = [];
  for (const [path, sub] of subschemas(schema)) {
    if (!isObject(sub)) continue;
    for (const keyword of Object.keys(sub)) {
      if (known.has(keyword) && !NOT_ASSERTING.has(keyword)) found.push({ keyword, pointer: pointer([...path, keyword]) });
    }
  }
  return found;
}
