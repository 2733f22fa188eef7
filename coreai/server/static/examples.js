// Ready examples of the constraint panel: each sets its editor and, when the prompt is empty, a prompt.

export const SCHEMAS = {
  "Extraction": {
    prompt: "Extract the contact: Ada Lovelace, ada@example.org, 36 years old, works at Analytical Engines.",
    schema: {
      type: "object",
      properties: {
        name: { type: "string", maxLength: 40 },
        email: { type: "string", format: "email" },
        age: { type: "integer", minimum: 0, maximum: 150 },
        employed: { type: "boolean" },
      },
      required: ["name", "email", "age", "employed"],
    },
  },
  "A nested form": {
    prompt: "Fill in a shipping form for two books sent to Paris.",
    schema: {
      type: "object",
      properties: {
        customer: {
          type: "object",
          properties: { name: { type: "string", maxLength: 30 }, tier: { enum: ["basic", "plus", "pro"] } },
          required: ["name", "tier"],
        },
        items: {
          type: "array",
          minItems: 1,
          maxItems: 3,
          items: {
            type: "object",
            properties: { sku: { type: "string", pattern: "^[A-Z]{3}-[0-9]{3}$" }, quantity: { type: "integer", minimum: 1, maximum: 9 } },
            required: ["sku", "quantity"],
          },
        },
        address: {
          type: "object",
          properties: { city: { type: "string", maxLength: 20 }, country: { type: "string", minLength: 2, maxLength: 2 } },
          required: ["city", "country"],
        },
      },
      required: ["customer", "items", "address"],
    },
  },
  "A tool call": {
    prompt: "What is the weather in Oslo? Answer with the call to make.",
    schema: {
      type: "object",
      properties: {
        name: { const: "get_weather" },
        arguments: {
          type: "object",
          properties: { city: { type: "string", maxLength: 30 }, unit: { enum: ["celsius", "fahrenheit"] } },
          required: ["city", "unit"],
        },
      },
      required: ["name", "arguments"],
    },
  },
};

export const LARK = `start: expr
expr: term (("+" | "-") term)*
term: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/`;

export const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The current weather in a city.",
      parameters: {
        type: "object",
        properties: { city: { type: "string", maxLength: 30 }, unit: { enum: ["celsius", "fahrenheit"] } },
        required: ["city", "unit"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search",
      description: "Search the web.",
      parameters: { type: "object", properties: { query: { type: "string", maxLength: 60 } }, required: ["query"] },
    },
  },
];

export const pretty = (value) => JSON.stringify(value, null, 2);
