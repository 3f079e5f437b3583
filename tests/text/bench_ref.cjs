// bench_ref.cjs - encoding throughput of the reference, @huggingface/tokenizers,
// measured as tests/bench/tok_bench.c measures trainyard's: every line of a
// file (the newline excluded, one encode call per line) after one untimed
// warm-up pass. Prints {"bytes", "lines", "ids", "seconds", "cpu_seconds",
// "mb_per_s"}: MB (10^6 bytes) per CPU-second of the process, as tok_bench.
//
//   NODE_PATH=node_modules node bench_ref.cjs TOKENIZER_DIR FILE
"use strict";
const fs = require("fs");
const { Tokenizer } = require("@huggingface/tokenizers");

const [dir, file] = process.argv.slice(2);
const tokenizer = new Tokenizer(
  JSON.parse(fs.readFileSync(`${dir}/tokenizer.json`, "utf8")),
  JSON.parse(fs.readFileSync(`${dir}/tokenizer_config.json`, "utf8")),
);
const bytes = fs.statSync(file).size;
const lines = fs.readFileSync(file, "utf8").split("\n");
if (lines.length && lines[lines.length - 1] === "") lines.pop();

function pass() {
  let ids = 0;
  for (const line of lines) ids += tokenizer.encode(line, { add_special_tokens: false }).ids.length;
  return ids;
}
pass();
const t0 = process.hrtime.bigint();
const c0 = process.cpuUsage();
const ids = pass();
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
const c = process.cpuUsage(c0);
const cpu = (c.user + c.system) / 1e6;
console.log(JSON.stringify({ bytes, lines: lines.length, ids, seconds: +seconds.toFixed(3),
                             cpu_seconds: +cpu.toFixed(3), mb_per_s: +(bytes / cpu / 1e6).toFixed(2) }));
