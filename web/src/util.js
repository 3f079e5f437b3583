// util.js - small DOM and formatting helpers shared by the views.

// el('div', {class: 'x', onclick: fn}, child, 'text', ...): a new element.
// Attributes starting with "on" become listeners; null/false ones are skipped.
export function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

export const FINAL_STATES = ['succeeded', 'failed', 'cancelled'];
export const ACTIVE_STATES = ['starting', 'running'];
export const isFinal = (state) => FINAL_STATES.includes(state);

// Bytes in binary units, 3 significant figures: 1536 -> "1.50 KiB".
export function fmtBytes(n) {
  if (n === null || n === undefined || !isFinite(n)) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toPrecision(3) : String(Math.round(n))) + ' ' + units[i];
}

export function fmtNum(x, digits = 3) {
  if (x === null || x === undefined || !isFinite(x)) return '–';
  return Number(x).toFixed(digits);
}

export function fmtRate(x) {
  if (x === null || x === undefined || !isFinite(x) || x <= 0) return '–';
  return x >= 10000 ? (x / 1000).toFixed(1) + 'k' : String(Math.round(x));
}

// "42s", "5m", "3h 2m", "4d": the time since an RFC 3339 instant.
export function fmtAge(iso, now = Date.now()) {
  if (!iso) return '–';
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm';
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
  return Math.floor(s / 86400) + 'd';
}

export function fmtTime(iso) {
  if (!iso) return '–';
  const d = new Date(iso);
  return d.toLocaleString(undefined, { hour12: false });
}

// Seconds as "1m23s", "2h01m", "5s".
export function fmtDuration(s) {
  const t = Math.round(s);
  const pad = (n) => String(n).padStart(2, '0');
  if (t >= 3600) return Math.floor(t / 3600) + 'h' + pad(Math.floor(t / 60) % 60) + 'm';
  if (t >= 60) return Math.floor(t / 60) + 'm' + pad(t % 60) + 's';
  return t + 's';
}

// A job's progress as the server computes it (server/progress.h): from a
// job (prefix '') or a progress event's data (prefix 'job_'). Returns
// {fraction (null: unknown), label: 'training 45% · eta 1m23s · 2.0k tok/s'}.
export function jobProgress(o, prefix = '') {
  const phase = o[prefix + 'progress_phase'];
  if (!phase) return { fraction: null, label: '–' };
  const f = o[prefix + 'progress'] || 0;
  let label = phase + ' ' + Math.floor(f * 100) + '%';
  const eta = o[prefix + 'eta_seconds'];
  if (eta > 0) label += ' · eta ' + fmtDuration(eta);
  const tps = o[prefix + 'tokens_per_s'];
  if (tps > 0) label += ' · ' + fmtRate(tps) + ' tok/s';
  return { fraction: f, label };
}

// A progress bar: fraction in [0, 1] (null: unknown), with a text label.
export function bar(fraction, label, cls = '') {
  const f = fraction === null || !isFinite(fraction) ? 0 : Math.max(0, Math.min(1, fraction));
  const fill = el('span', { class: 'fill' });
  fill.style.width = (f * 100).toFixed(1) + '%';
  return el('span', { class: 'bar ' + cls, role: 'progressbar', 'aria-valuemin': 0,
                      'aria-valuemax': 100, 'aria-valuenow': Math.round(f * 100) },
            fill, el('span', { class: 'label' }, label));
}

export function badge(state) {
  return el('span', { class: 'badge s-' + state }, state);
}

// A one-line notice for the next view to show once (the jobs list shows
// what the job page just deleted).
let flash = '';
export function setFlash(text) { flash = text; }
export function takeFlash() {
  const t = flash;
  flash = '';
  return t;
}

export function debounce(fn, ms) {
  let t = null;
  return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
}
