// Tool calling through Qwen 2.5's own chat template, on a generated tiny model with Qwen
// 2.5's tokenizer (random weights: only calls made certain by tool_choice can be checked).
// Run by tests/api/openai_client_test.cc.
import assert from "node:assert/strict";
import path from "node:path";
import test from "node:test";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const require = createRequire(path.join(process.env.STRATA_NPM_DIR, "package.json"));
const { default: OpenAI } = await import(pathToFileURL(require.resolve("openai")).href);
const { default: Ajv2020 } = await import(pathToFileURL(require.resolve("ajv/dist/2020.js")).href);

const client = new OpenAI({
  apiKey: process.env.STRATA_API_KEY,
  baseURL: `http://127.0.0.1:${process.env.STRATA_PORT}/v1`,
  maxRetries: 0,
  timeout: 60_000,
});
const model = (await client.models.list()).data[0].id;
const ajv = new Ajv2020({ strict: false });

const tools = [
  {
    type: "function",
    function: {
      name: "convert",
      description: "Convert an amount between currencies",
      parameters: {
        type: "object",
        properties: {
          amount: { type: "integer", minimum: 0, maximum: 10000 },
          from: { enum: ["EUR", "USD", "JPY"] },
          to: { enum: ["EUR", "USD", "JPY"] },
        },
        required: ["amount", "from", "to"],
      },
    },
  },
];

test("qwen template: required and named calls, round trip", async () => {
  const messages = [
    { role: "system", content: "You convert currencies." },
    { role: "user", content: "How much is 20 euros in yen?" },
  ];
  const validate = ajv.compile(tools[0].function.parameters);
  const r = await client.chat.completions.create({
    model, messages, tools, tool_choice: "required", n: 2, seed: 5, max_tokens: 300,
  });
  for (const c of r.choices) {
    assert.equal(c.finish_reason, "tool_calls", JSON.stringify(c.message));
    for (const call of c.message.tool_calls) {
      assert.equal(call.function.name, "convert");
      assert.ok(validate(JSON.parse(call.function.arguments)), call.function.arguments);
    }
  }
  const call = r.choices[0].message.tool_calls[0];
  // The call and its answer go back through Qwen's template (which writes arguments as an
  // object and the answer inside <tool_response>).
  const followup = await client.chat.completions.create({
    model, tools, max_tokens: 3,
    messages: [
      ...messages,
      { role: "assistant", content: null, tool_calls: [call] },
      { role: "tool", tool_call_id: call.id, content: '{"amount": 3240, "currency": "JPY"}' },
    ],
  });
  assert.equal(followup.choices.length, 1);
  assert.ok(followup.usage.prompt_tokens > r.usage.prompt_tokens);
});
