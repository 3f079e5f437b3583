// jobs.js - the jobs list: state, progress, age; filtered by state (on the
// server) and by name or id (here); refreshed every few seconds.

import { api } from './api.js';
import {el, bar, badge, fmtAge, jobProgress, takeFlash, ACTIVE_STATES} from './util.js';

const STATES = ['queued', 'starting', 'running', 'succeeded', 'failed', 'cancelled'];
const REFRESH_MS = 2000;

export function mountJobs(root, query) {
  let state = query.get('state') || '';
  let text = query.get('q') || '';
  let jobs = [];
  let next = null;
  let pages = 1;
  let timer = null;
  let gone = false;

  const filterBox = el('input', { type: 'search', placeholder: 'filter by name or id',
                                  'aria-label': 'filter by name or id', value: text,
                                  oninput: () => { text = filterBox.value; render(); } });
  const chips = el('div', { class: 'chips', role: 'group', 'aria-label': 'state filter' },
    ['', ...STATES].map((s) => el('button', {
      type: 'button', class: 'chip' + (s === state ? ' on' : ''), dataset: { state: s },
      onclick: () => { state = s; pages = 1; syncUrl(); load(); },
    }, s || 'all')));
  const tbody = el('tbody');
  const more = el('button', { type: 'button', class: 'link', hidden: true,
                              onclick: () => { pages++; load(); } }, 'Load more');
  const status = el('p', { class: 'muted small' });
  const flash = takeFlash();
  root.replaceChildren(
      el('section', {class: 'card'},
         el('div', {class: 'row wrap'}, el('h1', {}, 'Jobs'), el('span', {class: 'grow'}),
            el('a', {class: 'button primary', href: '#/submit'}, 'New job')),
         flash ? el('p', {class: 'notice', id: 'notice', role: 'status'}, flash) : null,
         el('div', {class: 'row wrap'}, chips, filterBox),
         el('div', {class: 'scroll'},
            el('table', {class: 'jobs'},
               el('thead', {},
                  el('tr', {}, el('th', {}, 'job'), el('th', {}, 'state'),
                     el('th', {class: 'wide'}, 'progress'), el('th', {}, 'ranks'),
                     el('th', {}, 'age'))),
               tbody)),
         el('div', {class: 'row'}, more, el('span', {class: 'grow'}), status)));

  function syncUrl() {
    for (const b of chips.children) b.classList.toggle('on', b.dataset.state === state);
    const q = new URLSearchParams();
    if (state) q.set('state', state);
    history.replaceState(null, '', '#/' + (q.toString() ? '?' + q : ''));
  }

  async function load() {
    clearTimeout(timer);
    if (document.hidden) { // a background tab polls nothing
      timer = setTimeout(load, REFRESH_MS);
      return;
    }
    try {
      let got = [];
      let token = null;
      for (let p = 0; p < pages; p++) {
        // The server's own page size: it caps what a request may ask for.
        const q = new URLSearchParams();
        if (state) q.set('state', state);
        if (token) q.set('page_token', token);
        const r = await api('GET', '/v1/jobs?' + q);
        got = got.concat(r.jobs || []);
        token = r.next_page_token;
        if (!token) break;
      }
      if (gone) return;
      jobs = got;
      next = token;
      status.textContent = 'updated ' + new Date().toLocaleTimeString(undefined, { hour12: false });
      render();
    } catch (e) {
      if (gone) return;
      status.textContent = 'cannot list jobs: ' + e.message;
    }
    if (!gone) timer = setTimeout(load, REFRESH_MS);
  }

  function render() {
    const needle = text.trim().toLowerCase();
    const shown = jobs.filter((j) => !needle || j.name.toLowerCase().includes(needle) ||
                                     j.id.toLowerCase().includes(needle));
    more.hidden = !next;
    if (!shown.length) {
      tbody.replaceChildren(el('tr', {}, el('td', { colspan: 5, class: 'muted' },
        jobs.length ? 'no job matches the filter' : 'no jobs yet')));
      return;
    }
    tbody.replaceChildren(...shown.map((j) => {
      // The server's figures (server/progress.h): phase, percent, ETA, rate.
      const p = jobProgress(j);
      const active = ACTIVE_STATES.includes(j.state);
      return el('tr', { dataset: { id: j.id, state: j.state } },
        el('td', {}, el('a', { href: '#/jobs/' + encodeURIComponent(j.id) }, j.name),
           el('div', { class: 'muted small mono' }, j.id)),
        el('td', {}, badge(j.state)),
        el('td', { class: 'wide' }, bar(p.fraction, p.label, active ? 'live' : '')),
        el('td', {}, j.world_size + ' × ' + j.device),
        el('td', { title: j.created_at }, fmtAge(j.created_at)));
    }));
  }

  load();
  return () => { gone = true; clearTimeout(timer); };
}
