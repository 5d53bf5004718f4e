// Schema validation of rendered Kubernetes objects, offline, with the `kubernetes-models`
// npm package: its validators check types, enums and required fields; they accept unknown
// fields, so this script also walks every object against the fields its TypeScript
// interfaces declare and reports any field Kubernetes would not know.
//
//   node k8s_schema.mjs NPM_DIR OBJECTS.json     (a JSON list of objects)
// Exit status 1 with one line per problem.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const [npmDir, objectsFile] = process.argv.slice(2);
const require = createRequire(path.join(npmDir, "package.json"));
const modelsDir = path.dirname(require.resolve("kubernetes-models/package.json"));
const machineryDir = path.dirname(require.resolve("@kubernetes-models/apimachinery/package.json"));

// Interface name (short "IDeployment" and long "IIoK8sApiAppsV1Deployment") -> {field: type}.
const interfaces = new Map();
function indexDir(dir) {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory() && entry.name !== "node_modules" && entry.name !== "_schemas") indexDir(p);
    else if (entry.name.endsWith(".d.ts")) indexFile(p);
  }
}
function indexFile(file) {
  const text = fs.readFileSync(file, "utf8");
  for (const m of text.matchAll(/export interface (I\w+)( extends TypeMeta)? \{([\s\S]*?)\n\}/g)) {
    const fields = m[2] ? { apiVersion: "string", kind: "string" } : {};
    const body = m[3].replace(/\/\*\*[\s\S]*?\*\//g, "");
    // Field types may span lines ({ [key: string]: string; }): read to the ";" at depth 0.
    for (const f of body.matchAll(/^\s+"([^"]+)"\??: /gm)) {
      let depth = 0, i = f.index + f[0].length, type = "";
      for (; i < body.length; i++) {
        const c = body[i];
        if (c === "{" || c === "<") depth++;
        if (c === "}" || c === ">") depth--;
        if (c === ";" && depth === 0) break;
        type += c;
      }
      fields[f[1]] = type.replace(/\s+/g, " ").trim();
    }
    interfaces.set(m[1], fields);
    for (const a of text.matchAll(new RegExp(`\\b${m[1]} as (I\\w+)`, "g"))) interfaces.set(a[1], fields);
  }
}
indexDir(modelsDir);
indexDir(machineryDir);

const problems = [];
function walk(value, type, where) {
  if (value === null || value === undefined || !type) return;
  let t = type;
  const array = t.match(/^Array<(.+)>$/);
  if (array) {
    if (Array.isArray(value)) value.forEach((v, i) => walk(v, array[1], `${where}[${i}]`));
    return;
  }
  if (!/^I\w+$/.test(t) || typeof value !== "object" || Array.isArray(value)) return;
  const fields = interfaces.get(t);
  if (!fields) return;  // an opaque type (IntOrString, Quantity, ...)
  for (const [k, v] of Object.entries(value)) {
    if (!(k in fields)) problems.push(`${where}: unknown field "${k}"`);
    else walk(v, fields[k], `${where}.${k}`);
  }
}

const objects = JSON.parse(fs.readFileSync(objectsFile, "utf8"));
for (const o of objects) {
  const where = `${o.kind}/${o.metadata?.name}`;
  const group = o.apiVersion.includes("/") ? o.apiVersion : o.apiVersion;
  const file = path.join(modelsDir, group, `${o.kind}.js`);
  if (!fs.existsSync(file)) {
    problems.push(`${where}: no model for ${o.apiVersion} ${o.kind}`);
    continue;
  }
  const Model = (await import(pathToFileURL(file).href))[o.kind];
  try {
    new Model(o).validate();
  } catch (e) {
    problems.push(`${where}: ${e.message.split("\n").slice(0, 4).join(" ")}`);
  }
  walk(o, `I${o.kind}`, where);
}
for (const p of problems) console.log(p);
console.log(`${objects.length} objects validated, ${problems.length} problems`);
process.exit(problems.length ? 1 : 0);
