// job.js - one job, live: header with cancel (or, once it has ended, delete)
// button, the per-rank table
// (phase, step progress, loss, tokens/s, host and device peaks drawn against
// the full model's size), loss and throughput charts with the samples of
// train.sample_prompts beside them, the event timeline and
// the ranks' logs. Starts from GET job/ranks/metrics, then follows the
// event stream from its first event.

import {api, followEvents, ApiError} from './api.js';
import { RankChart, rankColor } from './charts.js';
import {el, bar, badge, fmtBytes, fmtNum, fmtRate, fmtTime, isFinal, debounce, jobProgress, setFlash, ACTIVE_STATES} from './util.js';

const LOG_REFRESH_MS = 3000;
const DELETE_RETRY_MS = 500;  // while a cancelled job's ranks still stop (503)
const DELETE_TRIES = 120;
const LOG_KEEP = 256 * 1024; // bytes of a log shown (its tail)
// The charts' first fill: each rank's curve thinned by the server to at
// most this many points (its extremes kept), however long the job.
const CHART_POINTS = 2000;

export function mountJob(root, id) {
  const base = '/v1/jobs/' + encodeURIComponent(id);
  let job = null;
  let attempt = 0;
  let ranks = new Map();        // rank -> latest row (GET ranks, then progress events)
  let loadBytes = new Map();    // rank -> bytes_total seen while loading (this attempt)
  let lastPhase = new Map();    // rank -> phase, for the timeline's phase changes
  let stream = null;
  let gone = false;
  let logRank = 0;
  let logTimer = null;
  // The shown log: whose it is ("rank/attempt"), the text kept (its last
  // LOG_KEEP characters), where the next read starts (-1: read its tail
  // first) and the decoder that joins characters split between reads.
  let log = { key: '', text: '', end: -1, decoder: null, seq: 0 };
  const seen = [];              // event ids received, in order (for tests)

  const head = el('section', { class: 'card', id: 'job-head' });
  const rankBody = el('tbody');
  const memNote = el('p', { class: 'muted small', id: 'mem-note' });
  const lossHost = el('div', { class: 'chart', id: 'chart-loss' });
  const tpsHost = el('div', { class: 'chart', id: 'chart-tps' });
  // train.objective dpo: TRL's reward margin and accuracy beside the loss.
  const marginHost = el('div', { class: 'chart', id: 'chart-dpo-margins', hidden: true });
  const accHost = el('div', { class: 'chart', id: 'chart-dpo-accuracies', hidden: true });
  const timeline = el('ol', { class: 'timeline', id: 'timeline' });
  const logTabs = el('div', { class: 'chips', role: 'tablist' });
  const logPre = el('pre', { class: 'log', id: 'log', tabindex: 0 });
  const live = el('span', { class: 'live-dot', id: 'live' });
  const progressHost = el('div', { class: 'job-progress', id: 'job-progress' });
  // train.sample_prompts: what the model says as it trains (the "sample"
  // events), newest first, beside the loss chart; hidden for a job without.
  const samplesList = el('ol', { class: 'samples', id: 'samples-list' });
  const samplesNote = el('p', { class: 'muted small', id: 'samples-note' });
  const samplesHost = el('div', { class: 'samples-box', id: 'samples', hidden: true },
                         el('h3', {}, 'Samples'), samplesNote, samplesList);

  root.replaceChildren(
    head,
    el('section', { class: 'card' },
      el('div', { class: 'row' }, el('h2', {}, 'Ranks'), el('span', { class: 'grow' }), live),
      el('div', { class: 'scroll' },
        el('table', { class: 'ranks', id: 'ranks' },
          el('thead', {}, el('tr', {},
            el('th', {}, 'rank'), el('th', {}, 'phase'), el('th', { class: 'wide' }, 'step'),
            el('th', {}, 'loss'), el('th', {}, 'tok/s'),
            el('th', { class: 'mem' }, 'host peak'), el('th', { class: 'mem' }, 'device peak'))),
          rankBody)),
      memNote),
    el('section', { class: 'card charts' }, lossHost, marginHost, accHost, samplesHost, tpsHost),
    el('div', { class: 'split' },
      el('section', { class: 'card' }, el('h2', {}, 'Timeline'),
         el('div', { class: 'scroll-y' }, timeline)),
      el('section', { class: 'card' },
         el('div', { class: 'row wrap' }, el('h2', {}, 'Log'), logTabs), logPre)));

  const lossChart = new RankChart(lossHost, 'loss', (v) => fmtNum(v, 3));
  const tpsChart = new RankChart(tpsHost, 'tokens/s',
                                 (v) => (v >= 10000 ? (v / 1000).toFixed(1) + 'k' : String(Math.round(v))));
  const marginChart = new RankChart(marginHost, 'reward margin (dpo)', (v) => fmtNum(v, 3));
  const accChart = new RankChart(accHost, 'reward accuracy (dpo)', (v) => fmtNum(v, 2));
  lossChart.draw();
  tpsChart.draw();
  // A step's DPO metrics (an event's dpo, or a metrics answer's series at i).
  function addDpo(rank, step, margin, accuracy) {
    if (margin === undefined && accuracy === undefined) return;
    marginHost.hidden = accHost.hidden = false;
    marginChart.add(rank, step, margin);
    accChart.add(rank, step, accuracy);
  }

  // --- the header ---------------------------------------------------------
  function renderHead() {
    const j = job;
    const cancellable = ['queued', ...ACTIVE_STATES].includes(j.state);
    const spec = j.spec || {};
    const train = spec.train || {};
    if ((train.sample_prompts || []).length) {
      samplesHost.hidden = false;
      samplesNote.textContent = 'greedy, ' + (train.sample_max_new_tokens || '') +
          ' tokens at most, ' + (train.sample_every > 0 ? 'every ' + train.sample_every +
          ' steps and ' : '') + 'at the end';
    }
    const box = el('div', { class: 'confirm', hidden: true },
      'Cancel this job? ',
      el('button', { type: 'button', class: 'danger', id: 'cancel-yes', onclick: doCancel },
         'Yes, cancel'),
      el('button', { type: 'button', class: 'link', onclick: () => { box.hidden = true; } }, 'No'));
    const delBox =
        el('div', {class: 'confirm', hidden: true, id: 'delete-confirm'},
           'Delete this job, its events and its rank logs from the server? Its output folder ',
           el('span', {class: 'mono'}, spec.output_dir || ''), ' stays. ',
           el('button', {type: 'button', class: 'danger', id: 'delete-yes', onclick: doDelete},
              'Yes, delete'),
           el('button', {
             type: 'button',
             class: 'link',
             onclick: () => {
               delBox.hidden = true;
             }
           },
              'No'));
    head.replaceChildren(
        el('div', {class: 'row wrap'}, el('h1', {}, j.name), badge(j.state),
           el('span', {class: 'grow'}),
           cancellable ? el('button', {
             type: 'button',
             class: 'danger',
             id: 'cancel',
             onclick: () => {
               box.hidden = false;
             }
           },
                            'Cancel job') :
                         null,
           isFinal(j.state) ? el('button', {
             type: 'button',
             class: 'danger',
             id: 'delete',
             onclick: () => {
               delBox.hidden = false;
             }
           },
                                 'Delete job') :
                              null),
        box, delBox, el('p', {class: 'reason', id: 'reason'}, j.reason || ''), progressHost,
        el('dl', {class: 'facts'}, fact('id', el('span', {class: 'mono'}, j.id)),
           fact(
               'attempt',
               String(j.attempt) + (j.max_restarts ? ' of ' + (j.max_restarts + 1) : '')),
           fact('ranks', j.world_size + ' × ' + j.device),
           fact(
               'training',
               (spec.use_lora ? 'LoRA r' + spec.lora_rank : 'full weights') + ', ' +
                   ((spec.train && spec.train.steps) || '?') + ' steps' +
                   (spec.gradient_checkpointing ? ', gradient checkpointing' : '')),
           fact(
               'loading',
               spec.fsdp && spec.fsdp.memory_efficient_load ? 'memory-efficient' : 'standard'),
           fact('created', fmtTime(j.created_at)), fact('started', fmtTime(j.started_at)),
           fact('finished', fmtTime(j.finished_at))));
    renderProgress(j, '');
  }

  function fact(k, v) { return el('div', {}, el('dt', {}, k), el('dd', {}, v)); }

  // The job's progress bar: from the job, then from each progress event's
  // job figures (o and prefix as jobProgress takes them).
  function renderProgress(o, prefix) {
    const p = jobProgress(o, prefix);
    progressHost.replaceChildren(bar(p.fraction, p.label,
                                     job && ACTIVE_STATES.includes(job.state) ? 'live' : ''));
  }

  async function doCancel(ev) {
    ev.target.disabled = true;
    try {
      job = await api('POST', base + ':cancel', { reason: 'from the web page' });
      renderHead();
    } catch (e) {
      head.append(el('p', { class: 'error' }, 'cancel failed: ' + e.message));
      ev.target.disabled = false;
    }
  }

  // Deletes the job and goes back to the list. A cancelled job's ranks may
  // still be stopping (503): the delete is tried again until they have.
  async function doDelete(ev) {
    ev.target.disabled = true;
    const note = el('p', {class: 'muted small', id: 'delete-status'});
    head.append(note);
    for (let tries = 1; !gone; tries++) {
      try {
        const was = await api('DELETE', base);
        setFlash(
            'Deleted job ' + was.id + ' (' + was.name + ', ' + was.state + '); its ' +
            'output folder ' + ((was.spec && was.spec.output_dir) || '') + ' stays.');
        location.hash = '#/';
        return;
      } catch (e) {
        if (e instanceof ApiError && e.status === 503 && tries < DELETE_TRIES) {
          note.textContent = 'waiting for its ranks to stop…';
          await new Promise((r) => setTimeout(r, DELETE_RETRY_MS));
          continue;
        }
        note.remove();
        head.append(el('p', {class: 'error'}, 'delete failed: ' + e.message));
        ev.target.disabled = false;
        return;
      }
    }
  }

  // --- ranks and memory -----------------------------------------------------
  // The full model's size: the server's model_bytes (its parameter count,
  // computed once in C, in the job's dtype); where the server cannot know
  // it, what the ranks read while loading (each reads its own shard with
  // memory_efficient_load, so the sum; else each reads everything, so the
  // largest).
  function modelBytes() {
    if (job && job.model_bytes > 0) return job.model_bytes;
    const vals = [...loadBytes.values()].filter((v) => v > 0);
    if (!vals.length) return null;
    const me = job && job.spec && job.spec.fsdp && job.spec.fsdp.memory_efficient_load;
    return me ? vals.reduce((a, b) => a + b, 0) : Math.max(...vals);
  }

  function memCell(label0, bytes, model, scale) {
    if (!(bytes > 0)) return el('td', { class: 'mem muted', 'data-label': label0 }, '–');
    const f = model ? bytes / model : bytes / scale;
    const label = fmtBytes(bytes) + (model ? ' · ' + Math.round(f * 100) + '%' : '');
    return el('td', { class: 'mem', 'data-label': label0 },
              bar(f, label, model && f > 1 ? 'over' : 'mem'));
  }

  function renderRanks() {
    const model = modelBytes();
    const rows = [...ranks.values()].sort((a, b) => a.rank - b.rank);
    const scale = Math.max(1, ...rows.map((r) => Math.max(r.host_peak_bytes || 0,
                                                           r.device_peak_bytes || 0)));
    if (!rows.length) {
      rankBody.replaceChildren(el('tr', {}, el('td', { colspan: 7, class: 'muted' },
        job && job.state === 'queued' ? 'queued: no rank has started yet' : 'no ranks')));
    } else {
      rankBody.replaceChildren(...rows.map((r) => {
        const total = r.total_steps || 0;
        const bytes = (r.phase === 'loading' || r.phase === 'tokenizing' || r.phase === 'reference') &&
          r.bytes_total > 0;
        const frac = total > 0 ? r.step / total : bytes ? r.bytes_loaded / r.bytes_total : null;
        const label = bytes && r.phase === 'reference'
          ? r.bytes_loaded + ' / ' + r.bytes_total + ' pairs'
          : bytes ? fmtBytes(r.bytes_loaded) + ' / ' + fmtBytes(r.bytes_total) :
                              (r.step || 0) + ' / ' + (total || '?');
        const phase = el('td', { class: 'phase', title: r.message || '', 'data-label': 'phase' },
          el('span', { class: 'swatch' }), ' ', r.phase || '–',
          r.state && r.state !== 'running' && r.state !== r.phase
            ? el('span', { class: 'muted small' }, ' (' + r.state + ')') : null,
          r.message && (r.phase === 'failed' || r.state === 'failed')
            ? el('div', { class: 'error small' }, r.message) : null);
        phase.querySelector('.swatch').style.background = rankColor(r.rank);
        return el('tr', { dataset: { rank: r.rank, phase: r.phase || '', step: r.step || 0 } },
          el('td', { 'data-label': 'rank' }, String(r.rank)),
          phase,
          el('td', { class: 'wide', 'data-label': 'step' },
             bar(frac, label, ['done', 'failed'].includes(r.phase) ? '' : 'live')),
          el('td', { class: 'num', 'data-label': 'loss' }, fmtNum(r.loss, 4)),
          el('td', { class: 'num', 'data-label': 'tok/s' }, fmtRate(r.tokens_per_s)),
          memCell('host peak', r.host_peak_bytes, model, scale),
          memCell('device peak', r.device_peak_bytes, model, scale));
      }));
    }
    memNote.replaceChildren(model
      ? el('span', {}, 'Peaks are drawn against the full model: ', el('b', {}, fmtBytes(model)),
           '. A rank below 100% never held the whole model.')
      : 'The full model\'s size is not known yet (it is learnt while the ranks load); ' +
        'peaks are drawn against the largest one.');
  }

  // A progress report (from an event) into the row of its rank.
  function applyReport(rep) {
    if (rep.attempt > attempt) newAttempt(rep.attempt);
    if (rep.attempt !== attempt) return;
    const row = Object.assign(ranks.get(rep.rank) || { rank: rep.rank }, rep);
    ranks.set(rep.rank, row);
    if (rep.bytes_total > 0) loadBytes.set(rep.rank, Math.max(loadBytes.get(rep.rank) || 0,
                                                               rep.bytes_total));
    if (rep.job_progress_phase !== undefined && job && ACTIVE_STATES.includes(job.state))
      renderProgress(rep, 'job_');
    if (rep.phase === 'training' && rep.step > 0) {
      lossChart.add(rep.rank, rep.step, rep.loss);
      tpsChart.add(rep.rank, rep.step, rep.tokens_per_s);
      if (rep.dpo) addDpo(rep.rank, rep.step, rep.dpo.rewards_margins, rep.dpo.rewards_accuracies);
    }
  }

  function newAttempt(a) {
    attempt = a;
    ranks = new Map();
    loadBytes = new Map();
    lastPhase = new Map();
    lossChart.clear();
    tpsChart.clear();
    marginChart.clear();
    accChart.clear();
  }

  const refreshRanks = debounce(async () => {
    try {
      const r = await api('GET', base + '/ranks');
      if (gone || r.attempt < attempt) return;
      if (r.attempt > attempt) newAttempt(r.attempt);
      for (const row of r.ranks || []) {
        ranks.set(row.rank, Object.assign(ranks.get(row.rank) || {}, row));
        if (row.bytes_total > 0)
          loadBytes.set(row.rank, Math.max(loadBytes.get(row.rank) || 0, row.bytes_total));
      }
      renderRanks();
      renderLogTabs();
    } catch (_) { /* the next event retries */ }
  }, 150);

  let finalLog = false;
  const refreshJob = debounce(async () => {
    try {
      job = await api('GET', base);
      if (gone) return;
      renderHead();
      // The ranks' last lines land as they stop: read the log once more.
      if (isFinal(job.state) && !finalLog) {
        finalLog = true;
        clearTimeout(logTimer);
        logTimer = setTimeout(loadLog, 1000);
      }
    } catch (_) { /* the next event retries */ }
  }, 150);

  // --- samples ------------------------------------------------------------------
  // One "sample" event: the prompt, then what was generated after it.
  function addSample(x, id) {
    samplesHost.hidden = false;
    const att = x.attempt > 1 ? ' (attempt ' + x.attempt + ')' : '';
    samplesList.prepend(el('li', { dataset: { step: x.step, seq: id || '' } },
      el('div', { class: 'sample-step muted small' }, 'step ' + x.step + att),
      el('div', { class: 'sample-body' },
         el('span', { class: 'sample-prompt' }, x.prompt),
         el('span', { class: 'sample-text' }, x.text))));
  }

  // --- the timeline -----------------------------------------------------------
  function addTimeline(ev) {
    const d = ev.data || {};
    const x = d.data || {};
    let text = null, cls = ev.type;
    // Restarts: later attempts' lines say which attempt they belong to.
    const att = x.attempt > 1 ? ' (attempt ' + x.attempt + ')' : '';
    if (ev.type === 'state') {
      text = (x.from || 'new') + ' → ' + x.to + (x.to === 'starting' ? att : '') +
             (x.reason ? ': ' + x.reason : '');
      cls += ' s-' + x.to;
    } else if (ev.type === 'rank') {
      text = 'rank ' + x.rank + att + ' ' + x.state +
             (x.exit_code !== undefined ? ' (exit ' + x.exit_code + ')' : '') +
             (x.message ? ': ' + x.message : '');
    } else if (ev.type === 'progress') {
      const key = x.attempt + '/' + x.rank;
      if (lastPhase.get(key) === x.phase) return;
      lastPhase.set(key, x.phase);
      text = 'rank ' + x.rank + att + ' ' + x.phase + (x.message ? ': ' + x.message : '');
    } else if (ev.type === 'sample') {
      text = 'rank ' + x.rank + att + ' sample at step ' + x.step;
    } else {
      text = ev.type;
    }
    const t = d.t ? new Date(d.t * 1000).toLocaleTimeString(undefined, { hour12: false }) : '';
    timeline.prepend(el('li', { class: cls, dataset: { seq: ev.id || '' } },
                        el('time', {}, t), ' ', text));
  }

  // --- events -------------------------------------------------------------------
  let renderQueued = false;
  function onEvent(ev) {
    seen.push(ev.id);
    const x = (ev.data && ev.data.data) || {};
    if (ev.type === 'progress') applyReport(x);
    if (ev.type === 'sample') addSample(x, ev.id);
    if (ev.type === 'state') {
      if (x.attempt > attempt && x.to === 'starting') newAttempt(x.attempt);
      if (job) { // until refreshJob brings the whole job
        job.state = x.to;
        job.reason = x.reason;
        job.attempt = Math.max(job.attempt, x.attempt || 0);
        renderHead();
      }
      refreshJob();
      refreshRanks();
    }
    if (ev.type === 'rank') {
      const row = ranks.get(x.rank);
      if (row && x.attempt === attempt)
        Object.assign(row, { state: x.state, message: x.message, finished_at: ev.data.t || 1 });
      refreshRanks();
      // The shown rank has stopped: its log is whole now.
      if (x.rank === logRank && x.attempt === attempt) {
        clearTimeout(logTimer);
        logTimer = setTimeout(loadLog, 200);
      }
    }
    addTimeline(ev);
    if (!renderQueued) {
      renderQueued = true;
      requestAnimationFrame(() => { renderQueued = false; if (!gone) renderRanks(); });
    }
  }

  function onStatus(s, detail) {
    live.className = 'live-dot ' + s;
    live.textContent = s === 'live' ? 'live' : s === 'ended' ? 'final' : 'reconnecting…';
    live.title = detail || '';
  }

  // --- logs -------------------------------------------------------------------
  function renderLogTabs() {
    const n = job ? job.world_size : 0;
    if (logTabs.children.length === n) return;
    logTabs.replaceChildren(...Array.from({ length: n }, (_, r) => el('button', {
      type: 'button', class: 'chip' + (r === logRank ? ' on' : ''), role: 'tab',
      dataset: { rank: r }, onclick: () => { logRank = r; loadLog(); },
    }, 'rank ' + r)));
  }

  async function loadLog() {
    clearTimeout(logTimer);
    for (const b of logTabs.children) b.classList.toggle('on', Number(b.dataset.rank) === logRank);
    // A rank has a log once its process was started (it then has a pid).
    const row = ranks.get(logRank);
    if (!job || attempt < 1 || !row) {
      logPre.textContent = 'no log yet: the job has not started';
    } else if (row.pid === null && !row.reports) {
      logPre.textContent = 'no log: rank ' + logRank +
                           (isFinal(job.state) ? ' was never started' : ' has not started yet');
    } else if (!(document.hidden && logPre.textContent)) { // a background tab waits
      // Its tail first, then only what was written since (X-Log-End).
      const key = logRank + '/' + attempt;
      if (key !== log.key) log = { key, text: '', end: -1, decoder: new TextDecoder(), seq: log.seq };
      const my = ++log.seq;
      const cur = log;
      try {
        const part = cur.end < 0 ? 'tail=' + LOG_KEEP : 'offset=' + cur.end;
        const r = await api('GET', base + '/ranks/' + logRank + '/log?attempt=' + attempt + '&' +
                            part, undefined, { bytes: true });
        if (cur === log && my === log.seq) { // no later read, nor another log, took over
          if (cur.end < 0 && Number(r.headers.get('X-Log-Start')) > 0) cur.text = '…\n';
          cur.text += cur.decoder.decode(r.data, { stream: true });
          cur.end = Number(r.headers.get('X-Log-End'));
          if (cur.text.length > LOG_KEEP) cur.text = '…\n' + cur.text.slice(-LOG_KEEP);
          const atEnd = logPre.scrollTop + logPre.clientHeight >= logPre.scrollHeight - 4;
          logPre.textContent = cur.text || '(empty)';
          if (atEnd) logPre.scrollTop = logPre.scrollHeight;
        }
      } catch (e) {
        if (cur === log && my === log.seq) logPre.textContent = e.message;
      }
    }
    if (!gone && job && !isFinal(job.state)) logTimer = setTimeout(loadLog, LOG_REFRESH_MS);
  }

  // --- start --------------------------------------------------------------------
  (async () => {
    try {
      job = await api('GET', base);
      const [r, m] = await Promise.all([api('GET', base + '/ranks'), api('GET', base + '/metrics?max_points=' + CHART_POINTS)]);
      if (gone) return;
      attempt = r.attempt || job.attempt || 0;
      for (const row of r.ranks || []) ranks.set(row.rank, row);
      for (const s of (m.attempt === attempt && m.ranks) || [])
        s.steps.forEach((step, i) => {
          lossChart.add(s.rank, step, s.loss[i]);
          tpsChart.add(s.rank, step, s.tokens_per_s[i]);
          if (s.dpo) addDpo(s.rank, step, s.dpo.rewards_margins[i], s.dpo.rewards_accuracies[i]);
        });
      renderHead();
      renderRanks();
      renderLogTabs();
      loadLog();
      // A final job's ranks may still be stopping: their events follow.
      const pending = () => [...ranks.values()].some((r) => (r.pid || r.state === 'running') &&
                                                          !r.finished_at);
      stream = followEvents(id, { onEvent, onStatus, pending });
      window.tyJobView = { id, seen, stream, lossChart, tpsChart, marginChart, accChart };
    } catch (e) {
      if (gone) return;
      root.replaceChildren(el('section', { class: 'card' }, el('h1', {}, 'Job ' + id),
        el('p', { class: 'error' }, e.message), el('a', { href: '#/' }, '← all jobs')));
    }
  })();

  return () => {
    gone = true;
    clearTimeout(logTimer);
    if (stream) stream.close();
    lossChart.destroy();
    tpsChart.destroy();
    marginChart.destroy();
    accChart.destroy();
    if (window.tyJobView && window.tyJobView.id === id) delete window.tyJobView;
  };
}
