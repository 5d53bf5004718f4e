// Real-world JSON Schemas with bounded strings and arrays, shared by the API tests and
// tests/bench/structured_bench.mjs: outputs under them must end with "stop" and validate.
export const schemas = {
  person: {
    type: "object",
    properties: {
      name: { type: "string", minLength: 1, maxLength: 8 },
      age: { type: "integer", minimum: 0, maximum: 120 },
      email: { type: "string", format: "email" },
      role: { enum: ["admin", "user", "guest"] },
      verified: { type: "boolean" },
    },
    required: ["name", "age", "role"],
    additionalProperties: false,
  },
  order: {
    type: "object",
    properties: {
      id: { type: "string", format: "uuid" },
      placed: { type: "string", format: "date-time" },
      items: {
        type: "array",
        minItems: 1,
        maxItems: 3,
        items: {
          type: "object",
          properties: {
            sku: { type: "string", pattern: "^[A-Z]{3}-[0-9]{4}$" },
            qty: { type: "integer", minimum: 1, maximum: 99 },
            price: { type: "number", minimum: 0, maximum: 1000 },
          },
          required: ["sku", "qty"],
        },
      },
      note: { anyOf: [{ type: "string", maxLength: 6 }, { type: "null" }] },
    },
    required: ["id", "items", "note"],
  },
  tree: {
    $defs: {
      node: {
        type: "object",
        properties: {
          label: { type: "string", maxLength: 4 },
          children: { type: "array", maxItems: 2, items: { $ref: "#/$defs/node" } },
        },
        required: ["label"],
      },
    },
    $ref: "#/$defs/node",
  },
  weather: {
    type: "object",
    properties: {
      city: { type: "string", maxLength: 10 },
      date: { type: "string", format: "date" },
      temp_c: { type: "integer", minimum: -60, maximum: 60 },
      sky: { const: "clear" },
      wind: { oneOf: [{ type: "integer", minimum: 0, maximum: 200 }, { enum: ["calm"] }] },
    },
    required: ["city", "date", "temp_c", "wind"],
  },
};
