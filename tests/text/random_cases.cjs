// random_cases.cjs - writes N generated test cases (cases.json's format,
// as bytes in hex) from a seeded generator, so that every run compares the
// same texts: runs of letters, digits, white space of every kind
// (U+0085, U+00A0, U+180E, U+3000, ...), punctuation, contractions, CJK,
// other scripts, emoji and ZWJ sequences, combining marks, special-token
// strings and parts of them, control characters, and in one case of five
// a few bytes that are not UTF-8.
//
//   node random_cases.cjs SEED N > cases.json
"use strict";
const [seed, count] = process.argv.slice(2).map(Number);
let state = seed >>> 0;
function random() { // mulberry32
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(random() * a.length)];
const pools = [
  [..."abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"], [..."0123456789"],
  [..." \t\n\r\v\f"], ["  ", "\n\n", " \n", "\r\n", "    "],
  [...".,;:!?'\"()[]{}<>/\\|@#$%^&*-_=+~`"],
  ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "n't"],
  [..."日本語中文한국어ひらがなカタカナ"], [..."مرحباभारतПриветéèêëàçñüößØÅ"],
  ["😀", "👍🏽", "🇫🇷", "🏳️‍🌈", "👨‍👩‍👧‍👦", "❤️", "\u200d", "\ufe0f"], ["\u0301", "\u0308", "\u0323"],
  ["\u00a0", "\u2003", "\u3000", "\u0085", "\ufeff", "\u200b", "\u2028", "\u1680", "\u180e"],
  ["<|begin_of_text|>", "<|eot_id|>", "<s>", "</s>", "<unk>", "<|end_of_text|>",
   "<|reserved_special_token_3|>", "<|"],
  ["▁", "Ġ", "Ċ"], ["\x00", "\x01", "\x7f"], ["𝔘", "𠀀", "🧑"], ["²", "½", "٣", "Ⅻ"],
];
const cases = [];
for (let i = 0; i < count; i++) {
  const n = 1 + Math.floor(random() * 40);
  let s = "";
  for (let k = 0; k < n; k++) s += pick(pick(pools));
  let bytes = [...Buffer.from(s, "utf8")];
  if (random() < 0.2) {
    for (let k = 1 + Math.floor(random() * 3); k > 0; k--)
      bytes.splice(Math.floor(random() * (bytes.length + 1)), 0, 0x80 + Math.floor(random() * 128));
  }
  cases.push({ name: `random${i}`, hex: Buffer.from(bytes).toString("hex") });
}
process.stdout.write(JSON.stringify(cases) + "\n");
