// strata's HTTP API through the official `openai` npm client (6.x), against a running
// server. Run by tests/api/openai_client_test.cc, which starts the deployment:
//
//   STRATA_NPM_DIR=... STRATA_PORT=... STRATA_API_KEY=... node --test openai_client_test.mjs
//
// Every test talks through the client's own request and stream parsing, so a shape the
// client does not understand fails here the way it would fail for a user.
import assert from "node:assert/strict";
import path from "node:path";
import test from "node:test";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const require = createRequire(path.join(process.env.STRATA_NPM_DIR, "package.json"));
const { default: OpenAI } = await import(pathToFileURL(require.resolve("openai")).href);

const baseURL = `http://127.0.0.1:${process.env.STRATA_PORT}/v1`;
const apiKey = process.env.STRATA_API_KEY;
const client = new OpenAI({ apiKey, baseURL, maxRetries: 0, timeout: 60_000 });
const models = await client.models.list();
const model = models.data[0].id;
const prompt = "Once upon a time, in a small village by the sea,";
const messages = [{ role: "user", content: "Tell me about the sea." }];

async function countTokens(text) {
  const r = await fetch(`http://127.0.0.1:${process.env.STRATA_PORT}/tokenize`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ model, prompt: text }),
  });
  return (await r.json()).count;
}

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

test("models.list", async () => {
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].object, "model");
  assert.equal(typeof models.data[0].created, "number");
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
});

test("completion with usage", async () => {
  const r = await client.completions.create({ model, prompt, max_tokens: 5, temperature: 0 });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, "text_completion");
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(typeof r.choices[0].text, "string");
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.completion_tokens, 5);
  assert.equal(r.usage.prompt_tokens, await countTokens(prompt));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 5);
});

test("streamed completion equals the whole one", async () => {
  const whole = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0 });
  const chunks = await collect(
    await client.completions.create({
      model, prompt, max_tokens: 12, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    }),
  );
  const text = chunks.flatMap((c) => c.choices.map((x) => x.text)).join("");
  assert.equal(text, whole.choices[0].text);
  const finishes = chunks.flatMap((c) => c.choices.map((x) => x.finish_reason)).filter((x) => x);
  assert.deepEqual(finishes, ["length"]);
  const last = chunks[chunks.length - 1];
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, 12);
  assert.equal(last.usage.prompt_tokens, whole.usage.prompt_tokens);
  for (const c of chunks.slice(0, -1)) assert.ok(c.usage == null, "usage only on the last chunk");
});

test("chat, whole and streamed", async () => {
  const whole = await client.chat.completions.create({
    model, messages, max_completion_tokens: 10, temperature: 0,
  });
  assert.match(whole.id, /^chatcmpl-/);
  assert.equal(whole.object, "chat.completion");
  assert.equal(whole.choices[0].message.role, "assistant");
  assert.equal(whole.choices[0].finish_reason, "length");
  assert.equal(whole.usage.completion_tokens, 10);
  const chunks = await collect(
    await client.chat.completions.create({
      model, messages, max_tokens: 10, temperature: 0, stream: true,
    }),
  );
  assert.equal(chunks[0].object, "chat.completion.chunk");
  assert.equal(chunks[0].choices[0].delta.role, "assistant", "the first chunk carries the role");
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("");
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(chunks[chunks.length - 1].choices[0].finish_reason, "length");
});

test("n samples with a seed are deterministic", async () => {
  const ask = () =>
    client.completions.create({ model, prompt, max_tokens: 8, temperature: 1.0, n: 3, seed: 42 });
  const [a, b] = [await ask(), await ask()];
  assert.equal(a.choices.length, 3);
  assert.deepEqual(a.choices.map((c) => c.index).sort(), [0, 1, 2]);
  assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text));
  assert.equal(a.usage.completion_tokens, 24);
  const c = await client.completions.create({
    model, prompt, max_tokens: 8, temperature: 1.0, n: 3, seed: 43,
  });
  assert.notDeepEqual(c.choices.map((x) => x.text), a.choices.map((x) => x.text));
  const chat = () =>
    client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0.8, n: 2, seed: 7 });
  const [x, y] = [await chat(), await chat()];
  assert.equal(x.choices.length, 2);
  assert.deepEqual(x.choices.map((c) => c.message.content), y.choices.map((c) => c.message.content));
});

test("stop strings end the text and are never streamed", async () => {
  const whole = await client.completions.create({
    model, prompt, max_tokens: 32, temperature: 0, ignore_eos: true,
  });
  const text = whole.choices[0].text;
  assert.ok(text.length >= 12, `greedy text too short: ${JSON.stringify(text)}`);
  const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
  const expected = text.slice(0, text.indexOf(stop));
  const stopped = await client.completions.create({
    model, prompt, max_tokens: 32, temperature: 0, stop: [stop, "never-appears-xyz"],
  });
  assert.equal(stopped.choices[0].text, expected);
  assert.equal(stopped.choices[0].finish_reason, "stop");
  const chunks = await collect(
    await client.completions.create({
      model, prompt, max_tokens: 32, temperature: 0, stop, stream: true,
    }),
  );
  const streamed = chunks.flatMap((c) => c.choices.map((x) => x.text)).join("");
  assert.equal(streamed, expected);
  assert.ok(!streamed.includes(stop));
});

test("logprobs in the completions and chat shapes", async () => {
  const r = await client.completions.create({
    model, prompt, max_tokens: 5, temperature: 0, logprobs: 2,
  });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 5);
  assert.equal(lp.token_logprobs.length, 5);
  assert.equal(lp.top_logprobs.length, 5);
  assert.equal(lp.text_offset.length, 5);
  assert.equal(lp.tokens.join(""), r.choices[0].text);
  for (let i = 0; i < 5; i++) {
    assert.ok(lp.token_logprobs[i] <= 0);
    const top = Object.values(lp.top_logprobs[i]);
    assert.ok(top.length >= 1 && top.length <= 2);
    // Greedy: the chosen token is the most likely one.
    assert.ok(Math.abs(Math.max(...top) - lp.token_logprobs[i]) < 1e-4);
  }
  const c = await client.chat.completions.create({
    model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  const content = c.choices[0].logprobs.content;
  assert.equal(content.length, 4);
  for (const t of content) {
    assert.equal(typeof t.token, "string");
    assert.ok(t.logprob <= 0);
    assert.ok(Array.isArray(t.bytes));
    assert.equal(t.top_logprobs.length, 3);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[2].logprob);
  }
});

test("max_tokens bounds the output", async () => {
  const one = await client.completions.create({ model, prompt, max_tokens: 1, temperature: 0 });
  assert.equal(one.usage.completion_tokens, 1);
  const many = await client.completions.create({
    model, prompt: [prompt, "A second prompt"], max_tokens: 3, temperature: 0,
  });
  assert.equal(many.choices.length, 2);
  assert.equal(many.usage.completion_tokens, 6);
});

test("errors: 400 bad parameters and over-long prompts", async () => {
  await assert.rejects(
    client.completions.create({ model, prompt, temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "temperature",
  );
  await assert.rejects(
    client.chat.completions.create({ model, messages: [], max_tokens: 2 }),
    (e) => e instanceof OpenAI.BadRequestError,
  );
  await assert.rejects(
    client.completions.create({ model, prompt: "word ".repeat(5000), max_tokens: 2 }),
    (e) => e instanceof OpenAI.BadRequestError && /context|long|length/i.test(e.message),
  );
});

test("errors: 404 unknown model", async () => {
  await assert.rejects(
    client.completions.create({ model: "no-such-model", prompt, max_tokens: 2 }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404,
  );
});

test("errors: 401 wrong key", async () => {
  const wrong = new OpenAI({ apiKey: "wrong-key", baseURL, maxRetries: 0 });
  await assert.rejects(
    wrong.completions.create({ model, prompt, max_tokens: 2 }),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401,
  );
});

test("errors: 413 body over the limit", async () => {
  // The test server runs with --max_body_bytes=262144.
  await assert.rejects(
    client.completions.create({ model, prompt: "x".repeat(300_000), max_tokens: 2 }),
    (e) => e instanceof OpenAI.APIError && e.status === 413,
  );
});

test("errors: 429 when the queue is full, and the rest completes", async () => {
  // The test server runs with --max_waiting=2 and --max_num_seqs=4.
  const calls = [];
  for (let i = 0; i < 40; i++) {
    calls.push(
      client.completions
        .create({ model, prompt: `${prompt} ${i}`, max_tokens: 100, ignore_eos: true })
        .then(() => "ok", (e) => e),
    );
  }
  const results = await Promise.all(calls);
  const limited = results.filter((r) => r instanceof OpenAI.RateLimitError);
  const ok = results.filter((r) => r === "ok");
  assert.ok(limited.length > 0, "no request was refused");
  // The queue is empty when the burst starts, so its first --max_waiting requests are
  // accepted whatever the timing; how many more get in depends on how fast the scheduler
  // admits them while the rest arrive (a Zen 5 let only 3 through).
  assert.ok(ok.length >= 2, `only ${ok.length} completed`);
  assert.equal(limited.length + ok.length, 40, String(results.find((r) => r !== "ok" && !(r instanceof OpenAI.RateLimitError))));
  // Still serving.
  const r = await client.completions.create({ model, prompt, max_tokens: 2 });
  assert.equal(r.usage.completion_tokens, 2);
});

// Structured output. The demo model has random weights and writes garbage, so the grammar
// is the only thing keeping its output valid: every output that ends with "stop" must
// parse and validate (ajv, with ajv-formats for "format"), and schemas whose strings and
// arrays are bounded must end with "stop".
const { default: Ajv2020 } = await import(pathToFileURL(require.resolve("ajv/dist/2020.js")).href);
const { default: addFormats } = await import(pathToFileURL(require.resolve("ajv-formats")).href);
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);

const { schemas } = await import("./structured_schemas.mjs");

test("structured output: JSON Schema outputs validate", async () => {
  let samples = 0;
  for (const [name, schema] of Object.entries(schemas)) {
    const validate = ajv.compile(schema);
    const r = await client.chat.completions.create({
      model,
      messages,
      n: 3,
      seed: 1234,
      temperature: 1,
      max_tokens: 1500,
      response_format: { type: "json_schema", json_schema: { name, schema, strict: true } },
    });
    for (const choice of r.choices) {
      samples += 1;
      assert.equal(choice.finish_reason, "stop", `${name}: bounded output did not end: ${choice.message.content}`);
      const value = JSON.parse(choice.message.content);
      assert.ok(validate(value), `${name}: ${choice.message.content}\n${JSON.stringify(validate.errors)}`);
    }
    // Seeded: the same request gives the same outputs.
    const again = await client.chat.completions.create({
      model, messages, n: 1, seed: 1234, temperature: 1, max_tokens: 1500,
      response_format: { type: "json_schema", json_schema: { name, schema } },
    });
    assert.equal(again.choices[0].message.content, r.choices[0].message.content);
  }
  assert.equal(samples, 12);
});

test("structured output: parse, json_object, completions, regex, choice and grammar", async () => {
  // The client's own parse() reads message.parsed from a json_schema response.
  const parsed = await client.chat.completions.parse({
    model, messages, seed: 5, max_tokens: 1500,
    response_format: { type: "json_schema", json_schema: { name: "person", schema: schemas.person, strict: true } },
  });
  assert.ok(ajv.validate(schemas.person, parsed.choices[0].message.parsed));
  // JSON mode: any object; unbounded, so it may run to max_tokens, but what stops parses.
  const objects = await client.chat.completions.create({
    model, messages, n: 4, seed: 9, max_tokens: 300, response_format: { type: "json_object" },
  });
  for (const c of objects.choices) {
    if (c.finish_reason === "stop") {
      const v = JSON.parse(c.message.content);
      assert.equal(typeof v, "object");
      assert.ok(v !== null && !Array.isArray(v));
    } else {
      assert.equal(c.finish_reason, "length");
      assert.match(c.message.content, /^ ?\{/);
    }
  }
  // vLLM's fields on /v1/completions.
  const choice = await client.completions.create({
    model, prompt, n: 4, seed: 3, max_tokens: 20, guided_choice: ["yes", "no", "maybe later"],
  });
  for (const c of choice.choices) {
    assert.ok(["yes", "no", "maybe later"].includes(c.text), c.text);
    assert.equal(c.finish_reason, "stop");
  }
  const regex = await client.completions.create({
    model, prompt, n: 4, seed: 4, max_tokens: 40, guided_regex: "[A-Z]{2}-\\d{3}(x|yz)?",
  });
  for (const c of regex.choices) assert.match(c.text, /^[A-Z]{2}-\d{3}(x|yz)?$/);
  const grammar = await client.completions.create({
    model, prompt, n: 2, seed: 6, max_tokens: 40,
    structured_outputs: { grammar: 'root ::= "The answer is " [0-9]{1,3} "."' },
  });
  for (const c of grammar.choices) assert.match(c.text, /^The answer is [0-9]{1,3}\.$/);
  // Streamed: the pieces add up to the whole output, which validates.
  const stream = await client.chat.completions.create({
    model, messages, seed: 1234, temperature: 1, max_tokens: 1500, stream: true,
    response_format: { type: "json_schema", json_schema: { name: "weather", schema: schemas.weather } },
  });
  let text = "";
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
  assert.ok(ajv.validate(schemas.weather, JSON.parse(text)), text);
});

test("structured output: min_tokens, logit_bias, stop strings and max_tokens", async () => {
  // min_tokens never forces a token the grammar forbids: the choice ends, and only end
  // tokens follow it until min_tokens is reached.
  const held = await client.completions.create({
    model, prompt, max_tokens: 20, min_tokens: 8, guided_choice: ["yes", "no"], seed: 1,
  });
  assert.ok(["yes", "no"].includes(held.choices[0].text), held.choices[0].text);
  assert.equal(held.choices[0].finish_reason, "stop");
  // A logit_bias against every token but the end cannot push the grammar out.
  const bias = {};
  for (let t = 3; t < 300; t++) bias[t] = -100;
  const biased = await client.completions.create({
    model, prompt, max_tokens: 20, logit_bias: bias, guided_regex: "[0-9]{3}", seed: 2,
  });
  assert.match(biased.choices[0].text, /^[0-9]{3}$/);
  // A stop string inside the JSON ends the output there.
  const stopped = await client.chat.completions.create({
    model, messages, max_tokens: 400, seed: 3, stop: [","],
    response_format: { type: "json_schema", json_schema: { name: "person", schema: schemas.person } },
  });
  assert.equal(stopped.choices[0].finish_reason, "stop");
  assert.ok(!stopped.choices[0].message.content.includes(","), stopped.choices[0].message.content);
  assert.match(stopped.choices[0].message.content, /^ ?\{"name"/);
  // max_tokens: "length", and the partial output.
  const cut = await client.chat.completions.create({
    model, messages, max_tokens: 5, seed: 4,
    response_format: { type: "json_schema", json_schema: { name: "person", schema: schemas.person } },
  });
  assert.equal(cut.choices[0].finish_reason, "length");
  assert.match(cut.choices[0].message.content, /^ ?\{/);
});

test("structured output: bad schemas are 400s naming the problem", async () => {
  const bad = async (response_format, pattern) => {
    await assert.rejects(
      client.chat.completions.create({ model, messages, max_tokens: 5, response_format }),
      (e) => e instanceof OpenAI.BadRequestError && pattern.test(e.message),
    );
  };
  const js = (schema) => ({ type: "json_schema", json_schema: { name: "x", schema } });
  await bad(js({ type: "string", contentMediaType: "text/html" }), /'contentMediaType' is not supported/);
  await bad(js({ $defs: { a: { $ref: "#/$defs/a" } }, $ref: "#/$defs/a" }), /no finite/);
  await bad(js({ type: "object", properties: { me: { $ref: "#" } }, required: ["me"] }), /no finite/);
  await bad(js({ type: "string", pattern: "(?=x)y" }), /lookaround/);
  await bad({ type: "xml" }, /json_object or json_schema/);
  const big = { enum: Array.from({ length: 12000 }, (_, i) => `v${i}`) };
  await bad(js(big), /more than 10000/);
  await assert.rejects(
    client.completions.create({ model, prompt, max_tokens: 5, guided_regex: "a", guided_choice: ["b"] }),
    (e) => e instanceof OpenAI.BadRequestError && /one kind of structured output/.test(e.message),
  );
  // Still serving.
  const r = await client.completions.create({ model, prompt, max_tokens: 2 });
  assert.equal(r.usage.completion_tokens, 2);
});

// Tool calling on the demo model (strata's default template, hermes format). Its random
// weights never call a tool of their own accord, so "required" and a named function,
// which a grammar makes certain, are what can be checked end to end; the parsers of every
// format are tested in server/api/tool_calls_test.cc.
const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather in a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["c", "f"] } },
        required: ["city", "unit"],
      },
    },
  },
  { type: "function", function: { name: "get_time", parameters: { type: "object", properties: {} } } },
];

test("tools: required, named, none, streamed and round-tripped", async () => {
  const weather = ajv.compile(tools[0].function.parameters);
  const required = await client.chat.completions.create({
    model, messages, tools, tool_choice: "required", n: 2, seed: 21, max_tokens: 400,
  });
  for (const c of required.choices) {
    assert.equal(c.finish_reason, "tool_calls");
    assert.ok(c.message.tool_calls.length >= 1);
    for (const call of c.message.tool_calls) {
      assert.match(call.id, /^call_/);
      assert.equal(call.type, "function");
      assert.ok(["get_weather", "get_time"].includes(call.function.name));
      const args = JSON.parse(call.function.arguments);
      if (call.function.name === "get_weather") assert.ok(weather(args), call.function.arguments);
    }
  }
  const named = await client.chat.completions.create({
    model, messages, tools, seed: 22, max_tokens: 400, parallel_tool_calls: false,
    tool_choice: { type: "function", function: { name: "get_weather" } },
  });
  const calls = named.choices[0].message.tool_calls;
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, "get_weather");
  assert.ok(weather(JSON.parse(calls[0].function.arguments)));
  const none = await client.chat.completions.create({
    model, messages, tools, tool_choice: "none", seed: 23, max_tokens: 8,
  });
  assert.equal(none.choices[0].message.tool_calls, undefined);
  // auto: the model is free (this one writes text), and what it wrote comes back as text.
  const auto = await client.chat.completions.create({ model, messages, tools, seed: 24, max_tokens: 8 });
  assert.equal(typeof auto.choices[0].message.content, "string");
  assert.equal(auto.choices[0].finish_reason, "length");
  // The client's own stream helper accumulates delta.tool_calls into whole calls.
  const runner = client.chat.completions.stream({
    model, messages, tools, seed: 22, max_tokens: 400, parallel_tool_calls: false,
    tool_choice: { type: "function", function: { name: "get_weather" } },
  });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.tool_calls.length, 1);
  assert.equal(final.choices[0].message.tool_calls[0].function.arguments, calls[0].function.arguments);
  assert.equal(final.choices[0].finish_reason, "tool_calls");
  // A conversation with the call and its answer goes back through the template.
  const followup = await client.chat.completions.create({
    model,
    tools,
    max_tokens: 4,
    messages: [
      ...messages,
      { role: "assistant", content: null, tool_calls: [calls[0]] },
      { role: "tool", tool_call_id: calls[0].id, content: '{"temp": 11}' },
    ],
  });
  assert.equal(followup.choices.length, 1);
  await assert.rejects(
    client.chat.completions.create({ model, messages, tools, tool_choice: { type: "function", function: { name: "nope" } } }),
    (e) => e instanceof OpenAI.BadRequestError && /nope/.test(e.message),
  );
  await assert.rejects(
    client.chat.completions.create({ model, messages, tools: [{ type: "function", function: {} }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "tools",
  );
});
