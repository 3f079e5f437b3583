// docs_test.js - the API explorer at /docs in a real headless Chromium
// (Debian's chromium, driven by playwright-core) against a real trainyardd
// that requires a token: the page loads /v1/openapi.json (served without a
// token, the same document as api/openapi.yaml) and lists every documented
// operation; "Try it out" on GET /v1/jobs, authorized through the page's
// Authorize dialog, answers 200 with the job the test submitted; the
// status page's token (session storage) authorizes the explorer by
// itself; no console errors (the page runs under the same strict CSP as the
// status page). Screenshots go to $TRAINYARD_BIN_DIR/tests/web-artifacts.
//
//   node docs_test.js        (ctest sets TRAINYARD_BIN_DIR and NODE_PATH)
'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { chromium } = require('playwright-core');
const yaml = require('js-yaml');
const { ART, CHROMIUM, waitFor, startServer: startTrainyardd } = require('./weblib');

const SRC = process.env.TRAINYARD_SRC_DIR || path.join(__dirname, '../..');
const TOKEN = 'docs-test-token-' + process.pid;
// A trainyardd with the test's token, models/tiny a spec may name.
const startServer = (dir) => startTrainyardd(dir, TOKEN, { hidden_size: 64 });

// Every documented operation as "METHOD /path".
function operations(doc) {
  const ops = [];
  for (const [p, item] of Object.entries(doc.paths))
    for (const m of Object.keys(item))
      if (['get', 'put', 'post', 'delete', 'patch'].includes(m)) ops.push(m.toUpperCase() + ' ' + p);
  return ops.sort();
}

async function main() {
  fs.mkdirSync(ART, { recursive: true });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ty-docs-'));
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ty-docs-profile-'));
  const srv = await startServer(dir);
  let ctx = null;
  let failed = false;
  const problems = [];
  try {
    // The document and the page need no token; the document is
    // api/openapi.yaml itself.
    const r = await fetch(srv.url + '/v1/openapi.json');
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^application\/json/);
    const doc = await r.json();
    const source = yaml.load(fs.readFileSync(path.join(SRC, 'api', 'openapi.yaml'), 'utf8'),
                             { schema: yaml.JSON_SCHEMA });
    assert.deepEqual(doc, source, 'GET /v1/openapi.json is api/openapi.yaml');
    const page = await fetch(srv.url + '/docs');
    assert.equal(page.status, 200);
    assert.match(page.headers.get('content-security-policy'), /default-src 'self'/);

    // A job for GET /v1/jobs to list ("slow": it stays running).
    const sub = await fetch(srv.url + '/v1/jobs', {
      method: 'POST', headers: { Authorization: 'Bearer ' + TOKEN, 'Content-Type': 'application/json' },
      body: JSON.stringify({ name: 'docs-slow', model_path: 'models/tiny', use_lora: true,
                             data: { path: 'train.txt' }, train: { steps: 100000 },
                             output_dir: 'runs/docs-slow' }) });
    const subText = await sub.text();
    assert.equal(sub.status, 201, subText);
    const job = JSON.parse(subText);

    ctx = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM, headless: true, viewport: { width: 1280, height: 900 },
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
             '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    const tab = ctx.pages()[0] || await ctx.newPage();
    tab.on('console', (m) => {
      if (m.type() === 'error' || m.type() === 'warning')
        problems.push('console ' + m.type() + ': ' + m.text());
    });
    tab.on('pageerror', (e) => problems.push('page error: ' + e.message));
    const elsewhere = [];
    tab.on('request', (q) => { if (!q.url().startsWith(srv.url) && !q.url().startsWith('data:')) elsewhere.push(q.url()); });

    // 1. The explorer lists every documented operation.
    await tab.goto(srv.url + '/docs');
    await tab.locator('.opblock').first().waitFor({ timeout: 20000 });
    await waitFor('the document summary', async () =>
      /trainyard REST API .*: \d+ paths/.test(await tab.textContent('#docs-status')));
    const shown = await tab.$$eval('.opblock', (bs) => bs.map((b) =>
      b.querySelector('.opblock-summary-method').textContent.trim() + ' ' +
      b.querySelector('.opblock-summary-path').getAttribute('data-path')));
    assert.deepEqual(shown.sort(), operations(doc), 'the explorer lists every operation');
    await tab.screenshot({ path: path.join(ART, 'docs.png') });

    // 2. Authorize with the token, then try GET /v1/jobs.
    await tab.click('.auth-wrapper .authorize');
    const bearer = tab.locator('.auth-container', { hasText: 'bearer' }).first();
    await bearer.locator('input').fill(TOKEN);
    await bearer.locator('button.authorize').click();
    await tab.click('.dialog-ux .close-modal');
    const list = tab.locator('#operations-jobs-ListJobs');
    await list.locator('.opblock-summary').click();
    await list.locator('.try-out__btn').click();
    await list.locator('.execute').click();
    const status = list.locator('.live-responses-table tr.response .response-col_status').first();
    await waitFor('the answer of GET /v1/jobs', async () => (await status.textContent()).trim() === '200');
    const body = await list.locator('.live-responses-table tr.response .response-col_description pre').first().textContent();
    assert.ok(body.includes(job.id), 'the answer lists the submitted job: ' + body.slice(0, 300));
    assert.ok((await list.locator('.request-url').textContent()).includes(srv.url + '/v1/jobs'),
              'the call went to this server');
    await tab.screenshot({ path: path.join(ART, 'docs-try-it.png'), fullPage: false });

    // 3. The status page's token authorizes the explorer by itself.
    await tab.evaluate((t) => sessionStorage.setItem('trainyard.token', t), TOKEN);
    await tab.goto(srv.url + '/docs#/jobs/GetJob');
    await tab.locator('.opblock').first().waitFor({ timeout: 20000 });
    await waitFor('the authorized lock', async () =>
      (await tab.locator('.auth-wrapper .authorize.locked').count()) === 1);

    assert.deepEqual(elsewhere, [], 'nothing is fetched from elsewhere');
    assert.deepEqual(problems, [], 'no console errors');
    console.log('docs page test passed; screenshots in ' + ART);
  } catch (e) {
    failed = true;
    if (problems.length) console.error('console problems:\n  ' + problems.join('\n  '));
    if (ctx) await ctx.pages()[0].screenshot({ path: path.join(ART, 'docs-failed.png'), fullPage: true });
    throw e;
  } finally {
    if (ctx) await ctx.close();
    srv.proc.kill('SIGTERM');
    await new Promise((r) => { if (srv.proc.exitCode !== null) r(); else srv.proc.on('exit', r); });
    fs.rmSync(profile, { recursive: true, force: true });
    if (failed) console.log('server directory kept: ' + dir);
    else fs.rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error('docs page test FAILED: ' + (e.stack || e.message));
  process.exitCode = 1;
});
