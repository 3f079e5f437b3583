// render.cjs - the reference side of the chat template tests: renders each
// case of a JSON file with @huggingface/jinja (installed by npm ci from
// tests/chat/package-lock.json) and writes what each gave.
//   node render.cjs cases.json results.json
// cases.json:   [{"source": template text, "context": {...}}, ...]
// results.json: [{"ok": true, "text": ...} | {"ok": false, "error": ...}, ...]
"use strict";
const fs = require("fs");
const { Template } = require("@huggingface/jinja");

const [input, output] = process.argv.slice(2);
if (!input || !output) {
  console.error("usage: node render.cjs cases.json results.json");
  process.exit(2);
}
const cases = JSON.parse(fs.readFileSync(input, "utf8"));
const results = cases.map(({ source, context }) => {
  try {
    return { ok: true, text: new Template(source).render(context) };
  } catch (e) {
    return { ok: false, error: String(e && e.message !== undefined ? e.message : e) };
  }
});
fs.writeFileSync(output, JSON.stringify(results));
