// app.js - the page's entry: hash routes (#/, #/jobs/<id>, #/submit), the
// token dialog, and the server status in the header.

import { api, onAuthNeeded, getToken, setToken } from './api.js';
import { mountJobs } from './jobs.js';
import { mountJob } from './job.js';
import { mountSubmit } from './submit.js';

const view = document.getElementById('view');
const conn = document.getElementById('conn');
const tokenBtn = document.getElementById('token-btn');
const dialog = document.getElementById('token-dialog');
const tokenForm = document.getElementById('token-form');
const tokenInput = document.getElementById('token-input');
let unmount = null;

// --- token ----------------------------------------------------------------
// One dialog shared by every request that got 401: they all wait for it.
// Dismissed (Escape): requests fail with their 401 message instead of
// asking again, until the Token button is used.
let pendingAuth = null;
let dismissed = false;
function askToken(why) {
  tokenBtn.hidden = false;
  if (dismissed) return Promise.resolve();
  if (pendingAuth) return pendingAuth;
  document.getElementById('token-why').textContent = why;
  tokenInput.value = '';
  pendingAuth = new Promise((resolve) => {
    const done = () => {
      dialog.removeEventListener('close', done);
      pendingAuth = null;
      resolve();
    };
    dialog.addEventListener('close', done);
  });
  if (!dialog.open) dialog.showModal();
  tokenInput.focus();
  return pendingAuth;
}
onAuthNeeded(askToken);
dialog.addEventListener('cancel', () => { dismissed = true; });
tokenForm.addEventListener('submit', (e) => {
  e.preventDefault();
  setToken(tokenInput.value.trim());
  dismissed = false;
  dialog.close();
});
document.getElementById('token-clear').addEventListener('click', () => {
  setToken('');
  dialog.close();
});
tokenBtn.hidden = !getToken();
tokenBtn.addEventListener('click', () => {
  dismissed = false;
  askToken('Change or forget the API token.').then(route);
});

// --- server status ------------------------------------------------------------
async function health() {
  try {
    const h = await fetch('/healthz', { cache: 'no-store', credentials: 'omit' });
    conn.className = 'conn ' + (h.ok ? 'ok' : 'bad');
    conn.textContent = h.ok ? 'server ok' : 'server: HTTP ' + h.status;
  } catch (_) {
    conn.className = 'conn bad';
    conn.textContent = 'server unreachable';
  }
}
health();
setInterval(health, 10000);

// --- routes ------------------------------------------------------------------------
function route() {
  if (unmount) unmount();
  unmount = null;
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, qs] = hash.split('?');
  const query = new URLSearchParams(qs || '');
  let nav = 'jobs';
  const m = /^\/jobs\/([^/]+)$/.exec(path);
  if (m) {
    unmount = mountJob(view, decodeURIComponent(m[1]));
  } else if (path === '/submit') {
    nav = 'submit';
    unmount = mountSubmit(view);
  } else {
    unmount = mountJobs(view, query);
  }
  for (const a of document.querySelectorAll('[data-nav]'))
    a.classList.toggle('on', a.dataset.nav === nav && !m);
  window.scrollTo(0, 0);
}
window.addEventListener('hashchange', route);
route();

// Exposed for the browser tests and for debugging from the console.
window.trainyard = { api };
