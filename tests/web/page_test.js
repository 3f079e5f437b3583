// page_test.js - the status page in a real headless Chromium (Debian's
// chromium, driven by playwright-core) against a real trainyardd whose ranks
// are played by ty_test_worker. The server requires a token, so the page
// must ask for one. Checks: the jobs list; a running job's rank rows and
// charts updating; the event stream resuming after forced drops with no
// event missed or repeated; cancel from the page, then delete the ended
// job from it; an invalid spec's field
// error shown as it is typed; a valid submit (gradient checkpointing
// chosen on the form, and shown on the job page) running to success; a
// restarted job's second attempt; the page at phone width; the jobs list
// paging through a server with small pages; the samples of
// train.sample_prompts beside the loss chart; a DPO job's reward margin and
// accuracy charts; no console errors.
// Screenshots go to $TRAINYARD_BIN_DIR/tests/web-artifacts.
//
//   node page_test.js        (ctest sets TRAINYARD_BIN_DIR and NODE_PATH)
'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { chromium } = require('playwright-core');
const { ART, CHROMIUM, sleep, waitFor, startServer: startTrainyardd } = require('./weblib');

const TOKEN = 'web-test-token-' + process.pid;
const PHONE = { width: 390, height: 844 };

// The model the jobs name: 115008 parameters (embeddings 256 x 64, two
// layers of 4 x 64 x 64 attention + 3 x 64 x 128 MLP + 2 x 64 norms, the
// final norm, an untied 256 x 64 head), counted by hand from the Llama
// layout, not by trainyard's code.
const TINY_CONFIG = { hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
                      num_attention_heads: 4, num_key_value_heads: 4, vocab_size: 256 };
const TINY_PARAMS = 115008;

// A trainyardd with the test's token over models/tiny of TINY_CONFIG.
const startServer = (dir, extra = []) => startTrainyardd(dir, TOKEN, TINY_CONFIG, extra);

async function call(srv, method, p, body) {
  const r = await fetch(srv.url + p, {
    method, headers: { Authorization: 'Bearer ' + TOKEN, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
}

// Every event id of a final job, read in one go (the stream ends after the
// final event).
async function allEventIds(srv, id) {
  const r = await fetch(srv.url + '/v1/jobs/' + id + '/events',
                        { headers: { Authorization: 'Bearer ' + TOKEN } });
  assert.equal(r.status, 200);
  const text = await r.text();
  return [...text.matchAll(/^id: (\d+)$/gm)].map((m) => m[1]);
}

function spec(name, steps) {
  return { name, model_path: 'models/tiny', world_size: 2, use_lora: true,
           fsdp: { memory_efficient_load: true }, data: { path: 'train.txt' },
           train: { steps }, output_dir: 'runs/' + name };
}

async function main() {
  fs.rmSync(ART, { recursive: true, force: true });
  fs.mkdirSync(ART, { recursive: true });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ty-web-'));
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ty-web-profile-'));
  const srv = await startServer(dir);
  let ctx = null;
  const problems = [];
  let failed = false;
  try {
    // The files are served without a token, typed, under a strict CSP;
    // unknown ones get the API's 404 error.
    const index = await fetch(srv.url + '/');
    assert.equal(index.status, 200);
    assert.match(index.headers.get('content-type'), /^text\/html/);
    assert.match(index.headers.get('content-security-policy'), /default-src 'self'/);
    const js = await fetch(srv.url + '/assets/uPlot.min.js');
    assert.equal(js.status, 200);
    assert.match(js.headers.get('content-type'), /^text\/javascript/);
    const missing = await fetch(srv.url + '/assets/nope.js');
    assert.equal(missing.status, 404);
    assert.equal((await missing.json()).error.code, 'NOT_FOUND');
    assert.equal((await fetch(srv.url + '/v1/jobs')).status, 401, 'the API itself needs the token');

    // "slow": 100 ms a step, so the job runs ~30 s unless cancelled.
    const running = await call(srv, 'POST', '/v1/jobs', spec('web-watch-slow', 300));
    assert.equal(running.status, 201, JSON.stringify(running.body));
    const jobId = running.body.id;

    ctx = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM, headless: true, viewport: { width: 1280, height: 900 },
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
             '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    const page = ctx.pages()[0] || await ctx.newPage();
    // Console errors fail the test, except Chromium's own line for a
    // response the page asked for and handles: 401 (it then asks for the
    // token) and 400 (the validation errors it shows).
    page.on('console', (m) => {
      if (m.type() !== 'error' && m.type() !== 'warning') return;
      if (/Failed to load resource: the server responded with a status of 40[01]/.test(m.text())) return;
      problems.push('console ' + m.type() + ': ' + m.text());
    });
    page.on('pageerror', (e) => problems.push('page error: ' + e.message));
    const logReads = []; // the first job's rank 0 log requests, in order
    page.on('request', (q) => {
      if (q.url().includes('/v1/jobs/' + jobId + '/ranks/0/log')) logReads.push(q.url());
    });
    // Which request a "Failed to load resource" line was about.
    page.on('response', (r) => {
      if (r.status() >= 402) problems.push('HTTP ' + r.status() + ' for ' + r.url());
    });

    // 1. The page asks for the token, then lists the job.
    await page.goto(srv.url + '/');
    await page.locator('#token-dialog[open]').waitFor({ timeout: 10000 });
    await page.screenshot({ path: path.join(ART, 'token.png') });
    await page.fill('#token-input', TOKEN);
    await page.click('#token-dialog button[type=submit]');
    const row = page.locator(`tr[data-id="${jobId}"]`);
    await row.waitFor({ timeout: 10000 });
    await waitFor('the job listed as running', async () => (await row.getAttribute('data-state')) === 'running');
    assert.equal(await page.evaluate(() => sessionStorage.getItem('trainyard.token')), TOKEN);
    assert.equal((await ctx.cookies()).length, 0, 'the page must not use cookies');
    await page.screenshot({ path: path.join(ART, 'jobs.png') });

    // 2. The job page: rank rows and charts advance while it trains.
    await row.locator('a').click();
    await page.locator('#ranks tr[data-rank="1"]').waitFor({ timeout: 10000 });
    const stepOf = (r) => page.locator(`#ranks tr[data-rank="${r}"]`).getAttribute('data-step').then(Number);
    const s0 = await waitFor('rank 0 training', async () => {
      const ph = await page.locator('#ranks tr[data-rank="0"]').getAttribute('data-phase');
      return ph === 'training' && (await stepOf(0)) > 0 ? stepOf(0) : 0;
    });
    const points = () => page.evaluate(() => [0, 1].map((r) => window.tyJobView.lossChart.count(r) +
                                                              window.tyJobView.tpsChart.count(r)));
    const p0 = await points();
    await waitFor('rank 0 step advancing', async () => (await stepOf(0)) >= s0 + 10);
    await waitFor('rank 1 step advancing', async () => (await stepOf(1)) >= s0 + 5);
    const p1 = await points();
    assert.ok(p1[0] > p0[0] && p1[1] > p0[1], `chart points must grow: ${p0} -> ${p1}`);
    assert.ok(await page.locator('#chart-loss canvas').count() > 0, 'the loss chart is drawn');
    assert.ok(await page.locator('#chart-tps canvas').count() > 0, 'the throughput chart is drawn');
    // Peaks are drawn against the full model: the server's parameter
    // count (computed once, in C) in the job's dtype.
    const view = (await call(srv, 'GET', '/v1/jobs/' + jobId)).body;
    assert.equal(view.param_count, TINY_PARAMS, 'the server counts the model\'s parameters');
    const elem = { float32: 4, bfloat16: 2, float16: 2 }[view.spec.dtype];
    assert.equal(view.model_bytes, TINY_PARAMS * elem, 'model_bytes: the parameters in the job\'s dtype');
    const kib = (TINY_PARAMS * elem / 1024).toPrecision(3);
    assert.ok((await page.textContent('#mem-note')).includes('full model: ' + kib + ' KiB'),
              'peaks are drawn against the server\'s model_bytes: ' + await page.textContent('#mem-note'));
    assert.ok(await page.locator('#timeline li.state').count() >= 2, 'state changes are on the timeline');
    // The job's own progress (the server's figures, moved by each event).
    await waitFor('the job progress bar while training', async () =>
      /^training \d+% · eta \d+(m\d\ds|s|h\d\dm) · .*tok\/s$/.test(
          (await page.textContent('#job-progress .label')).trim()));
    await waitFor('the rank log', async () => /\[rank 0\/2\]|rank 0/.test(await page.textContent('#log')));

    // 3. The stream resumes after drops (Last-Event-ID) without gaps.
    for (let i = 0; i < 3; i++) {
      const before = await page.evaluate(() => window.tyJobView.seen.length);
      await page.evaluate(() => window.tyJobView.stream.drop());
      await waitFor('events after a drop', async () =>
        (await page.evaluate(() => window.tyJobView.seen.length)) > before + 2);
    }
    await page.screenshot({ path: path.join(ART, 'job-running.png'), fullPage: true });

    // 4. Cancel from the page.
    await page.click('#cancel');
    await page.click('#cancel-yes');
    await waitFor('the cancelled badge', async () =>
      (await page.textContent('#job-head .badge')) === 'cancelled');
    const after = await call(srv, 'GET', '/v1/jobs/' + jobId);
    assert.equal(after.body.state, 'cancelled');
    assert.match(after.body.reason, /from the web page/);
    await waitFor('the stream to end', async () => (await page.textContent('#live')) === 'final');
    const want = await allEventIds(srv, jobId);
    const got = await page.evaluate(() => window.tyJobView.seen);
    assert.deepEqual(got, want, 'the page saw every event exactly once, in order');
    // The log, read as its tail and then only what was added, is the whole
    // log once the ranks have stopped.
    const whole = await (await fetch(srv.url + '/v1/jobs/' + jobId + '/ranks/0/log',
                                     { headers: { Authorization: 'Bearer ' + TOKEN } })).text();
    await waitFor('the whole log on the page', async () =>
      (await page.textContent('#log')) === whole);
    assert.ok(/[?&]tail=\d+/.test(logReads[0]) && logReads.length > 1 &&
              logReads.slice(1).every((u) => /[?&]offset=\d+/.test(u)),
              'the log is read as its tail, then from where the last read ended: ' +
              logReads.join(' '));
    await page.screenshot({ path: path.join(ART, 'job-cancelled.png'), fullPage: true });

    // 4b. Delete the job that has ended, from the page: asked first, then
    // the jobs list says what was deleted and no longer lists it.
    assert.equal(await page.locator('#cancel').count(), 0, 'an ended job has no cancel button');
    await page.click('#delete');
    assert.match(await page.textContent('#delete-confirm'), /runs\/web-watch-slow stays/);
    await page.click('#delete-yes');
    await page.waitForURL(/#\/$/, {timeout: 15000});
    await waitFor(
        'the deleted notice',
        async () => (await page.textContent('#notice'))
                        .startsWith('Deleted job ' + jobId + ' (web-watch-slow, cancelled)'));
    assert.equal((await call(srv, 'GET', '/v1/jobs/' + jobId)).status, 404);
    await waitFor(
        'the list without it (its only job)',
        async () => (await page.textContent('table.jobs tbody')) === 'no jobs yet');
    await page.screenshot({path: path.join(ART, 'job-deleted.png'), fullPage: true});

    // 5. Submit form: an invalid value gets its error next to its field.
    await page.goto(srv.url + '/#/submit');
    await page.fill('#f-model_path', 'models/tiny');
    await page.fill('#f-data-path', 'train.txt');
    await page.fill('#f-train-lr', '-1');
    await waitFor('the train.lr error', async () =>
      (await page.textContent('#f-train-lr-error')).length > 0);
    assert.equal(await page.getAttribute('#f-train-lr', 'aria-invalid'), 'true');
    assert.equal(await page.textContent('#f-model_path-error'), '', 'a valid field shows no error');
    await page.screenshot({ path: path.join(ART, 'submit-invalid.png'), fullPage: true });
    await page.fill('#f-extra', '{"trian": {}}');
    await waitFor('the unknown field error', async () =>
      /trian/.test(await page.textContent('#f-extra-error')));

    // The folder of a job that has not finished is refused by its field.
    const held = await call(srv, 'POST', '/v1/jobs', spec('web-held', 100000));
    assert.equal(held.status, 201, JSON.stringify(held.body));
    await page.fill('#f-extra', '');
    await page.fill('#f-output_dir', 'runs/web-held');
    await waitFor('the output_dir error', async () =>
      (await page.textContent('#f-output_dir-error')).includes(
        'is the output folder of job ' + held.body.id));
    await page.screenshot({ path: path.join(ART, 'submit-folder-taken.png'), fullPage: true });
    await call(srv, 'POST', '/v1/jobs/' + held.body.id + ':cancel');

    // ...and a valid spec is accepted and runs to success.
    await page.fill('#f-train-lr', '0.001');
    await page.fill('#f-name', 'web-form');
    await page.fill('#f-world_size', '2');
    await page.fill('#f-train-steps', '15');
    await page.fill('#f-output_dir', 'runs/web-form');
    await page.selectOption('#f-gradient_checkpointing', 'true');
    await waitFor('the valid verdict', async () =>
      /valid/.test(await page.textContent('#verdict')) &&
      (await page.getAttribute('#verdict', 'class')).includes('good'));
    assert.match(await page.textContent('#normalized'), /"output_dir": "[^"]*runs\/web-form"/,
                 'the normalized spec is shown');
    await page.click('#submit-btn');
    await page.waitForURL(/#\/jobs\//, { timeout: 10000 });
    await waitFor('the submitted job to succeed', async () =>
      (await page.textContent('#job-head .badge')) === 'succeeded', 30000);
    await waitFor('both ranks done', async () =>
      (await page.locator('#ranks tr[data-phase="done"]').count()) === 2);
    const formJob = await call(srv, 'GET', '/v1/jobs/' + page.url().split('/').pop());
    assert.equal(formJob.body.spec.gradient_checkpointing, true,
                 'the form sent gradient_checkpointing: ' + JSON.stringify(formJob.body.spec));
    assert.match(await page.textContent('#job-head'), /gradient checkpointing/);

    // 6. A restarted job ("flaky": rank 0 fails in attempt 1) shows its
    // second attempt only, and the restart on the timeline.
    const flaky = await call(srv, 'POST', '/v1/jobs', Object.assign(spec('web-flaky', 12),
                                                                    { max_restarts: 1 }));
    assert.equal(flaky.status, 201, JSON.stringify(flaky.body));
    await page.goto(srv.url + '/#/jobs/' + flaky.body.id);
    await waitFor('the flaky job to succeed', async () =>
      (await page.textContent('#job-head .badge')) === 'succeeded', 30000);
    await waitFor('both ranks of attempt 2 done', async () =>
      (await page.locator('#ranks tr[data-phase="done"]').count()) === 2);
    await waitFor('the header to show attempt 2', async () =>
      /attempt\s*2 of 2/.test(await page.textContent('#job-head')));
    assert.match(await page.textContent('#timeline'), /injected failure at step 1/);
    assert.match(await page.textContent('#timeline'), /starting \(attempt 2\)/);
    const flakyPoints = await page.evaluate(() => [0, 1].map((r) => window.tyJobView.lossChart.count(r)));
    assert.deepEqual(flakyPoints, [12, 12], 'the charts hold attempt 2\'s 12 steps per rank');

    // A short job's step axis ticks at whole steps only (uPlot alone put
    // a tick every 0.25 steps across 3 steps).
    const short = await call(srv, 'POST', '/v1/jobs', spec('web-short', 3));
    assert.equal(short.status, 201, JSON.stringify(short.body));
    await page.goto(srv.url + '/#/jobs/' + short.body.id);
    await waitFor('the short job to succeed', async () =>
      (await page.textContent('#job-head .badge')) === 'succeeded', 30000);
    await waitFor('its loss chart to hold 3 steps per rank', async () =>
      (await page.evaluate(() => window.tyJobView.lossChart.count(0))) === 3);
    const ticks = await page.evaluate(() => window.tyJobView.lossChart.plot.axes[0]._splits);
    assert.ok(ticks.length >= 2 && ticks.every(Number.isInteger), 'step ticks: ' + ticks);

    // train.sample_prompts: the "sample" events beside the loss chart,
    // newest first, every 3 steps and at the end; on the timeline too.
    const sampled = await call(srv, 'POST', '/v1/jobs', Object.assign(spec('web-samples', 7), {
      train: { steps: 7, sample_every: 3, sample_prompts: ['Once upon a time', 'Bonjour'] } }));
    assert.equal(sampled.status, 201, JSON.stringify(sampled.body));
    await page.goto(srv.url + '/#/jobs/' + sampled.body.id);
    await waitFor('the samples of steps 3, 6 and 7', async () =>
      (await page.locator('#samples-list li').count()) === 6, 30000);
    assert.ok(await page.locator('#samples').isVisible(), 'the samples are shown');
    const steps = await page.$$eval('#samples-list li', (ls) => ls.map((l) => l.dataset.step));
    assert.deepEqual(steps, ['7', '7', '6', '6', '3', '3'], 'newest first');
    const first = await page.textContent('#samples-list li:last-child');
    assert.match(first, /step 3/);
    assert.match(first, /Once upon a time ... sampled at step 3/);
    assert.match(await page.textContent('#samples-note'), /every 3 steps and at the end/);
    assert.match(await page.textContent('#timeline'), /rank 0 sample at step 7/);
    // Beside the loss chart: in the same card, on the same row.
    const [lossBox, samplesBox] = await Promise.all(['#chart-loss', '#samples'].map((q) =>
      page.locator(q).boundingBox()));
    assert.ok(Math.abs(lossBox.y - samplesBox.y) < 2 && samplesBox.x > lossBox.x,
              'the samples sit beside the loss chart: ' + JSON.stringify([lossBox, samplesBox]));
    await page.screenshot({ path: path.join(ART, 'job-samples.png'), fullPage: true });
    // A job without samples shows no samples panel.
    await page.goto(srv.url + '/#/jobs/' + short.body.id);
    await page.locator('#chart-loss canvas').waitFor();
    assert.ok(!(await page.locator('#samples').isVisible()), 'no samples panel without samples');

    // A DPO job's reward margin and accuracy charts beside the loss (the
    // test worker's "dpo" reports them: margin 0.1 S, accuracy S / steps),
    // live from the events and again from GET .../metrics after a reload;
    // a job without them shows neither chart.
    assert.ok(!(await page.locator('#chart-dpo-margins').isVisible()), 'no DPO charts without DPO');
    const pref = await call(srv, 'POST', '/v1/jobs', spec('web-dpo', 6));
    assert.equal(pref.status, 201, JSON.stringify(pref.body));
    await page.goto(srv.url + '/#/jobs/' + pref.body.id);
    const dpoPoints = () => page.evaluate(() => [window.tyJobView.marginChart.count(0),
                                                   window.tyJobView.accChart.count(0)]);
    await waitFor('the DPO charts of 6 steps', async () => (await dpoPoints()).every((n) => n === 6),
                  30000);
    assert.ok(await page.locator('#chart-dpo-margins canvas').isVisible(), 'the margin chart');
    assert.ok(await page.locator('#chart-dpo-accuracies canvas').isVisible(), 'the accuracy chart');
    await page.reload();
    await waitFor('the DPO charts from the metrics answer',
                  async () => (await dpoPoints()).every((n) => n === 6));
    const lastAcc = await page.evaluate(() => window.tyJobView.accChart.points.get(0).get(6));
    assert.equal(lastAcc, 1, 'the accuracy of step 6 of 6');
    await page.screenshot({ path: path.join(ART, 'job-dpo.png'), fullPage: true });

    // 7. Phone width: nothing wider than the screen; the key parts visible.
    await page.setViewportSize(PHONE);
    await page.goto(srv.url + '/#/jobs/' + flaky.body.id);
    await page.locator('#ranks tr[data-rank="1"]').waitFor();
    await page.locator('#chart-loss canvas').waitFor();
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, 'the job page fits the phone width (overflow ' + overflow + ' px)');
    assert.ok(await page.locator('#job-head h1').isVisible());
    assert.ok(await page.locator('#ranks').isVisible());
    await page.screenshot({ path: path.join(ART, 'phone-job.png'), fullPage: true });
    await page.goto(srv.url + '/#/');
    await page.locator(`tr[data-id="${flaky.body.id}"]`).waitFor();
    const overflowList = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflowList <= 0, 'the jobs list fits the phone width (overflow ' + overflowList + ' px)');
    await page.screenshot({ path: path.join(ART, 'phone-jobs.png'), fullPage: true });
    await page.goto(srv.url + '/#/submit');
    await page.locator('#f-name').waitFor();
    const overflowForm = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflowForm <= 0, 'the form fits the phone width (overflow ' + overflowForm + ' px)');

    // 8. A server whose pages hold two jobs: the list takes the server's
    // page size, and "Load more" brings the next page.
    const dir2 = fs.mkdtempSync(path.join(os.tmpdir(), 'ty-web-pages-'));
    const srv2 = await startServer(dir2, ['--page-max', '2']);
    try {
      const ids = [];
      for (let i = 0; i < 3; i++) {
        const r = await call(srv2, 'POST', '/v1/jobs', spec('web-page-' + i, 1));
        assert.equal(r.status, 201, JSON.stringify(r.body));
        ids.push(r.body.id);
      }
      await page.setViewportSize({ width: 1280, height: 900 });
      await page.goto(srv2.url + '/');
      await page.locator('#token-dialog[open]').waitFor({ timeout: 10000 });
      await page.fill('#token-input', TOKEN);
      await page.click('#token-dialog button[type=submit]');
      const listed = () => page.locator('tr[data-id]').evaluateAll((rows) => rows.map((r) => r.dataset.id));
      await waitFor('the first page of two jobs', async () => (await listed()).length === 2);
      assert.deepEqual(await listed(), [ids[2], ids[1]]);
      const moreButton = page.locator('button', { hasText: 'Load more' });
      assert.ok(await moreButton.isVisible(), '"Load more" is offered while pages remain');
      await moreButton.click();
      await waitFor('the second page', async () => (await listed()).length === 3);
      assert.deepEqual(await listed(), [ids[2], ids[1], ids[0]]);
      await waitFor('"Load more" gone after the last page', async () => !(await moreButton.isVisible()));
      await page.screenshot({ path: path.join(ART, 'pages.png') });
    } finally {
      srv2.proc.kill('SIGTERM');
      await new Promise((r) => { if (srv2.proc.exitCode !== null) r(); else srv2.proc.on('exit', r); });
      fs.rmSync(dir2, { recursive: true, force: true });
    }

    assert.deepEqual(problems, [], 'no console errors');
    console.log('web page test passed; screenshots in ' + ART);
  } catch (e) {
    failed = true;
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
  console.error('web page test FAILED: ' + (e.stack || e.message));
  process.exitCode = 1;
});
