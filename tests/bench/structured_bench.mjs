// Structured output at volume (issue "Structured output and tool calling"): hundreds of
// seeded samples from a running server, each under one of the real-world schemas of
// tests/api/structured_schemas.mjs, validated with ajv. The demo model's random weights
// write garbage, so the grammar is all that keeps these valid. Prints counts; exits
// non-zero if an output that ended with "stop" does not validate.
//
//   STRATA_NPM_DIR=$STRATA_CACHE_DIR/npm node tests/bench/structured_bench.mjs PORT [SAMPLES]
import path from "node:path";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const require = createRequire(path.join(process.env.STRATA_NPM_DIR, "package.json"));
const { default: OpenAI } = await import(pathToFileURL(require.resolve("openai")).href);
const { default: Ajv2020 } = await import(pathToFileURL(require.resolve("ajv/dist/2020.js")).href);
const { default: addFormats } = await import(pathToFileURL(require.resolve("ajv-formats")).href);
const { schemas } = await import("../api/structured_schemas.mjs");

const port = process.argv[2];
const total = Number(process.argv[3] ?? 240);
const client = new OpenAI({ apiKey: "none", baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0, timeout: 600_000 });
const model = (await client.models.list()).data[0].id;
const ajv = new Ajv2020({ strict: false });
addFormats(ajv);

const names = Object.keys(schemas);
const counts = Object.fromEntries(names.map((n) => [n, { samples: 0, stop: 0, valid: 0, invalid: 0, length: 0, tokens: 0 }]));
const started = Date.now();
const perCall = 8;
let failures = 0;
for (let call = 0; call * perCall < total; call++) {
  const name = names[call % names.length];
  const validate = ajv.compile(schemas[name]);
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: `Sample ${call}` }],
    n: perCall,
    seed: 1000 + call,
    temperature: 1,
    max_tokens: 1500,
    response_format: { type: "json_schema", json_schema: { name, schema: schemas[name], strict: true } },
  });
  const c = counts[name];
  c.tokens += r.usage.completion_tokens;
  for (const choice of r.choices) {
    c.samples += 1;
    if (choice.finish_reason !== "stop") {
      c.length += 1;
      continue;
    }
    c.stop += 1;
    let value;
    try {
      value = JSON.parse(choice.message.content);
    } catch {
      value = Symbol("unparsable");
    }
    if (typeof value !== "symbol" && validate(value)) {
      c.valid += 1;
    } else {
      c.invalid += 1;
      failures += 1;
      console.error(`${name}: invalid output: ${choice.message.content}`);
    }
  }
}
const seconds = (Date.now() - started) / 1000;
console.log(`schema     samples  stop  valid  invalid  length  tokens/sample`);
let all = 0;
for (const n of names) {
  const c = counts[n];
  all += c.samples;
  console.log(`${n.padEnd(10)} ${String(c.samples).padStart(7)} ${String(c.stop).padStart(5)} ${String(c.valid).padStart(6)} ${String(c.invalid).padStart(8)} ${String(c.length).padStart(7)} ${(c.tokens / Math.max(1, c.samples)).toFixed(1).padStart(14)}`);
}
console.log(`${all} samples in ${seconds.toFixed(1)} s; ${failures} invalid`);
process.exit(failures === 0 ? 0 : 1);
