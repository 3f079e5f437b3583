// weblib.js - what the Chromium tests of the status page (page_test.js) and
// of the API explorer (docs_test.js) share: the binaries, a free port,
// waiting for a condition, and a trainyardd that requires a token, in its
// own directory with a model directory and a data file for specs to name.
'use strict';

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');

const BIN = process.env.TRAINYARD_BIN_DIR || path.join(__dirname, '../../build');
const TRAINYARDD = path.join(BIN, 'server', 'trainyardd');
const WORKER = path.join(BIN, 'tests', 'ty_test_worker');
const CHROMIUM = process.env.TRAINYARD_CHROMIUM || '/usr/bin/chromium';
const ART = path.join(BIN, 'tests', 'web-artifacts');

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
    s.on('error', reject);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(what, fn, timeoutMs = 15000) {
  const end = Date.now() + timeoutMs;
  let last;
  while (Date.now() < end) {
    try { last = await fn(); if (last) return last; } catch (e) { last = e; }
    await sleep(100);
  }
  throw new Error('timed out waiting for ' + what + (last instanceof Error ? ': ' + last.message : ''));
}

// trainyardd in dir with token (TRAINYARD_TOKENS), its ranks played by the
// test worker; models/tiny holds config (an object) and a tokenizer.json
// (train.sample_prompts need one beside the model; the test worker reads
// none), train.txt some text. extra: more flags.
async function startServer(dir, token, config, extra = []) {
  for (const f of [TRAINYARDD, WORKER, CHROMIUM])
    if (!fs.existsSync(f)) throw new Error(f + ' is missing (build the server; deploy/install-deps.sh test installs chromium)');
  fs.mkdirSync(path.join(dir, 'models', 'tiny'), { recursive: true });
  fs.writeFileSync(path.join(dir, 'models', 'tiny', 'config.json'), JSON.stringify(config) + '\n');
  fs.writeFileSync(path.join(dir, 'models', 'tiny', 'tokenizer.json'), '{}\n');
  fs.writeFileSync(path.join(dir, 'train.txt'), 'hello trainyard\n'.repeat(1024));
  const port = await freePort();
  const log = fs.openSync(path.join(dir, 'trainyardd.log'), 'a');
  const env = Object.assign({}, process.env, { TRAINYARD_TOKENS: token });
  const proc = spawn(TRAINYARDD, [
    '--listen', '127.0.0.1:' + port, '--db', path.join(dir, 'var', 'ty.db'),
    '--state-dir', path.join(dir, 'var'), '--roots', dir, '--output-roots', dir,
    '--worker', WORKER, '--cpu-slots', '4', '--grace', '0.5', ...extra],
  { cwd: dir, env, stdio: ['ignore', log, log] });
  const url = 'http://127.0.0.1:' + port;
  await waitFor('trainyardd /healthz', async () => {
    if (proc.exitCode !== null) throw new Error('trainyardd exited: ' + proc.exitCode);
    return (await fetch(url + '/healthz')).ok;
  });
  return { url, proc, dir };
}

module.exports = { BIN, TRAINYARDD, WORKER, CHROMIUM, ART, freePort, sleep, waitFor, startServer };
