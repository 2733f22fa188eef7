// JSON Schema documents as the server reads them: the keywords its enforcement report walks
// (guided.enforcement, guided.schema.walk), JSON pointers, and where a schema error points.

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

/** The reference tokens of a pointer: "/a~1b/0" -> ["a/b", "0"]; "" -> []. */
export function tokens(text) {
  return text === "" ? [] : text.slice(1).split("/").map((t) => t.replaceAll("~1", "/").replaceAll("~0", "~"));
}

/** Whether `text` is a pointer to a value inside `doc`. */
export function resolves(doc, text) {
  if (text !== "" && !text.startsWith("/")) return false;
  let node = doc;
  for (const t of tokens(text)) {
    if (Array.isArray(node) && /^(0|[1-9][0-9]*)$/.test(t) && Number(t) < node.length) node = node[Number(t)];
    else if (isObject(node) && Object.hasOwn(node, t)) node = node[t];
    else return false;
  }
  return true;
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

/**
 * The keyword a pointer into a schema is at or inside: "/properties/a/type" -> "type",
 * "/properties/a" -> "properties" (a name in its map), "/required/0" -> "required"; "" -> null.
 */
export function keywordAt(text) {
  let keyword = null;
  let state = "keyword"; // what the next token is: a keyword, a member (name or index) of one, or in a value
  for (const t of tokens(text)) {
    const index = /^(0|[1-9][0-9]*)$/.test(t);
    if (state === "items") state = index ? "member" : "keyword"; // one schema, or a draft 7 tuple of them
    else if (state === "dependency") state = index ? "value" : "keyword"; // a schema, or a list of names
    if (state === "member") {
      state = keyword === "dependencies" ? "dependency" : "keyword";
    } else if (state === "keyword") {
      keyword = t;
      if (t === "items") state = "items";
      else if (SUBSCHEMA_MAP.has(t) || SUBSCHEMA_LIST.has(t)) state = "member";
      else if (!SUBSCHEMA.has(t)) state = "value";
    }
  }
  return keyword;
}

/**
 * Where a schema error points: {keyword, pointer, tool} from the server's error object and the
 * request it answered. The message names the pointer ("invalid schema at /properties/a/type: ...",
 * "a $ref at /properties/a/$ref points to ...", "cannot enforce pattern at /pattern: ..."); `param`
 * names the document it points into ("response_format.json_schema.schema",
 * "tools[1].function.parameters"). Of the texts after "at /" that could end the pointer (at a space,
 * ":", ";", ",", ")" or the end), the longest one that exists in that document is taken, so names with
 * spaces or colons are read whole. null when the message names no pointer.
 */
export function schemaErrorPlace(error, body) {
  const message = error.message || "";
  const start = message.search(/\bat \//);
  const tool = /^tools\[(\d+)\]/.exec(error.param || "");
  const place = { tool: tool ? body?.tools?.[Number(tool[1])]?.function?.name ?? null : null };
  if (start < 0) return { ...place, keyword: null, pointer: null };
  const rest = message.slice(start + 3);
  const doc = documentAt(body, error.param);
  const ends = [...rest.matchAll(/[\s:;,)]/g)].map((m) => m.index).concat(rest.length);
  let found = ends.map((end) => rest.slice(0, end)).filter((p) => doc !== undefined && resolves(doc, p)).pop();
  if (found === undefined) found = rest.slice(0, ends[0]); // not in the document the page has: up to the first stop
  if (found === "/" && !(doc !== undefined && resolves(doc, "/"))) found = ""; // the server writes the root as "/"
  return { ...place, keyword: keywordAt(found), pointer: found === "" ? "/" : found };
}

/** The value at a request field path ("tools[1].function.parameters") of `body`, or undefined. */
function documentAt(body, param) {
  if (!param) return undefined;
  let node = body;
  for (const [, key, index] of param.matchAll(/([^.[\]]+)|\[(\d+)\]/g)) {
    node = node?.[key ?? Number(index)];
  }
  return node;
}
