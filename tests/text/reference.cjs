// reference.cjs - the reference side of the tokenizer tests: encodes and
// decodes every case of a cases file with @huggingface/tokenizers (the
// JavaScript port of Hugging Face tokenizers) and prints the results as JSON.
//
//   node reference.cjs TOKENIZER_DIR CASES.json > reference.json
//
// A case is {"name", "text"} (a string), {"name", "hex"} (bytes, which may
// be invalid UTF-8) or {"name", "file"} (a file's bytes). Bytes become text
// through TextDecoder (WHATWG: each maximal invalid subsequence is U+FFFD),
// as any JavaScript caller of the reference would read them.
// Output: [{"name", "ids", "ids_special", "decoded", "decoded_skip"}]: ids
// without and with the special tokens, and the decoding of ids_special with
// and without skipping special tokens. The module is found through NODE_PATH.
"use strict";
const fs = require("fs");
const { Tokenizer } = require("@huggingface/tokenizers");

const [dir, casesPath] = process.argv.slice(2);
const tokenizer = new Tokenizer(
  JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8")),
  JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`, "utf8")),
);
const utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

function caseText(c) {
  if (c.text !== undefined) return c.text;
  if (c.hex !== undefined) return utf8.decode(Buffer.from(c.hex, "hex"));
  return utf8.decode(fs.readFileSync(c.file));
}

// decode() refuses an empty list; an empty list decodes to "".
function decode(ids, skip) {
  return ids.length ? tokenizer.decode(ids, { skip_special_tokens: skip }) : "";
}

const out = JSON.parse(fs.readFileSync(casesPath, "utf8")).map((c) => {
  const text = caseText(c);
  const ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
  const idsSpecial = tokenizer.encode(text, { add_special_tokens: true }).ids;
  return {
    name: c.name,
    ids,
    ids_special: idsSpecial,
    decoded: decode(idsSpecial, false),
    decoded_skip: decode(idsSpecial, true),
  };
});
process.stdout.write(JSON.stringify(out) + "\n");
