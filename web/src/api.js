// api.js - the REST client of the page: bearer token from session storage
// (never a cookie), the error model {error: {code, message, details}}, and
// Server-Sent Events read through fetch streaming (EventSource cannot send
// an Authorization header) with Last-Event-ID resume after a drop.

const TOKEN_KEY = 'trainyard.token';
const TAIL_READS = 30; // re-reads of a final job's stream while ranks stop

export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || 'HTTP ' + status);
    this.status = status;
    this.code = e.code || status;
    this.details = Array.isArray(e.details) ? e.details : [];
  }
}

let authHandler = null; // (reason) => Promise resolved when a new token is set

export function onAuthNeeded(fn) { authHandler = fn; }
export function getToken() { return sessionStorage.getItem(TOKEN_KEY) || ''; }
export function setToken(t) {
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra) {
  const h = Object.assign({ Accept: 'application/json' }, extra || {});
  const t = getToken();
  if (t) h.Authorization = 'Bearer ' + t;
  return h;
}

async function errorFrom(resp) {
  let body = null;
  try { body = await resp.json(); } catch (_) { /* not JSON: the status says enough */ }
  return new ApiError(resp.status, body);
}

// One request. body (an object) is sent as JSON. On 401 the page asks for a
// token once and retries. Resolves to the parsed JSON (or text for
// opts.text, or {data: Uint8Array, headers} for opts.bytes); rejects with
// ApiError.
export async function api(method, path, body, opts = {}) {
  for (let tries = 0; ; tries++) {
    const h = headers(opts.headers);
    if (body !== undefined) h['Content-Type'] = 'application/json';
    const resp = await fetch(path, {
      method, headers: h, signal: opts.signal, credentials: 'omit', cache: 'no-store',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (resp.status === 401 && authHandler && tries === 0) {
      const err = await errorFrom(resp);
      await authHandler(getToken() ? 'The token was refused: ' + err.message
                                   : 'This server needs an API token.');
      continue;
    }
    if (!resp.ok) throw await errorFrom(resp);
    if (resp.status === 204) return null;
    if (opts.bytes) return { data: new Uint8Array(await resp.arrayBuffer()), headers: resp.headers };
    return opts.text ? resp.text() : resp.json();
  }
}

// Follows GET /v1/jobs/{id}/events. handlers.onEvent({id, type, data}) for
// each event in order; handlers.onStatus('live' | 'reconnecting' | 'ended',
// detail). The server ends the stream after the job's final state change;
// any other end or error reconnects with Last-Event-ID, so nothing is missed
// or repeated. Ranks still stopping write their last events after that
// change: while handlers.pending() says some are, the stream is read again
// (from the last id) every second, a bounded number of times. Returns
// {close(), lastId, drop()}.
export function followEvents(jobId, handlers) {
  const ctl = { closed: false, abort: null, lastId: null, final: false };
  const url = '/v1/jobs/' + encodeURIComponent(jobId) + '/events';
  let delay = 500;

  async function once() {
    const abort = new AbortController();
    ctl.abort = abort;
    const h = headers({ Accept: 'text/event-stream' });
    if (ctl.lastId !== null) h['Last-Event-ID'] = ctl.lastId;
    const resp = await fetch(url, { headers: h, signal: abort.signal, credentials: 'omit',
                                    cache: 'no-store' });
    if (resp.status === 401 && authHandler) {
      await authHandler('This server needs an API token.');
      return false;
    }
    if (!resp.ok) throw await errorFrom(resp);
    handlers.onStatus && handlers.onStatus('live');
    delay = 500;
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      // Frames end with a blank line; CRLF and LF are both allowed.
      let m;
      while ((m = /\r?\n\r?\n/.exec(buf))) {
        const frame = buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
        const ev = parseFrame(frame);
        if (!ev) continue;
        if (ev.id !== null) ctl.lastId = ev.id;
        let data = null;
        try { data = JSON.parse(ev.data); } catch (_) { data = ev.data; }
        if (ev.type === 'state' && data && data.data && isFinalState(data.data.to)) ctl.final = true;
        if (!ctl.closed) handlers.onEvent({ id: ev.id, type: ev.type, data });
      }
    }
    // A normal end: the job is final (else the server or a proxy dropped us).
    return ctl.final;
  }

  async function loop() {
    let tails = 0;
    while (!ctl.closed) {
      try {
        if (await once()) {
          if (!handlers.pending || !handlers.pending() || ++tails > TAIL_READS) {
            handlers.onStatus && handlers.onStatus('ended');
            return;
          }
          await new Promise((r) => setTimeout(r, 1000));
          continue;
        }
      } catch (e) {
        if (ctl.closed) return;
        if (e instanceof ApiError && e.status === 404) {
          handlers.onStatus && handlers.onStatus('ended', e.message);
          return;
        }
        handlers.onStatus && handlers.onStatus('reconnecting', e.message);
      }
      if (ctl.closed) return;
      handlers.onStatus && handlers.onStatus('reconnecting');
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 8000);
    }
  }
  loop();
  return {
    close() { ctl.closed = true; if (ctl.abort) ctl.abort.abort(); },
    // For tests and the status line: the last event id received.
    get lastId() { return ctl.lastId; },
    // Drops the connection as a network failure would (the loop resumes).
    drop() { if (ctl.abort) ctl.abort.abort(); },
  };
}

function isFinalState(s) { return s === 'succeeded' || s === 'failed' || s === 'cancelled'; }

// One SSE frame -> {id, type, data}, or null for a comment-only frame.
function parseFrame(frame) {
  let id = null, type = 'message';
  const data = [];
  for (const line of frame.split(/\r?\n/)) {
    if (!line || line[0] === ':') continue;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value[0] === ' ') value = value.slice(1);
    if (field === 'id') id = value;
    else if (field === 'event') type = value;
    else if (field === 'data') data.push(value);
  }
  if (!data.length) return null;
  return { id, type, data: data.join('\n') };
}
