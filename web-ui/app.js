// bspweb web UI: a single-page app over the REST API under /api/v1.
//
// No framework, no build step, nothing fetched from elsewhere. Pages are
// chosen by the URL hash (#/jobs, #/jobs/ID, #/submit, #/programs, #/peers)
// so they can be linked to. The JWT from POST /api/v1/login lives in
// sessionStorage; a 401 anywhere sends the user back to the sign-in form.
//
// Server-Sent Events are read with fetch and a streaming body reader (an
// EventSource cannot send the Authorization header); a dropped stream is
// resumed with Last-Event-ID and events are deduplicated by id.

'use strict';

const API = '/api/v1';
const SESSION_KEY = 'bspweb.session';
const JOB_POLL_MS = 2000;
const LIST_POLL_MS = 5000;
const PEER_POLL_MS = 3000;
const MAX_SHOWN_LINES = 5000;
/** Output lines kept in memory per job page, at most; the oldest are dropped, a tenth at a time (`bspweb logs` has them all). */
const MAX_KEPT_LINES = 50000;
/** Pictures (PNG, JPEG, GIF, WebP raw records) shown per job page. */
const MAX_PICTURES = 100;
const PROGRAM_NAME_RE = /^[A-Za-z0-9_.-]{1,64}$/;
const MAX_NPROCS = 4096;
// `JobLimits::default()` (bsp-api/src/rest.rs): a submission that sets one
// limit sends them all.
const DEFAULT_LIMITS = { superstep_ms: 120000, memory_mib: 512, output_mib: 64, checkpoint_every: 1, replicas: 2, redundancy: 1 };
const MAX_UPLOAD_BYTES = 64 << 20;

// ---------------------------------------------------------------- DOM helpers

/** Creates an element. `attrs`: class, text, on<event> handlers, dataset, booleans, other attributes. */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  appendAll(el, children);
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';
function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  appendAll(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') el.textContent = v;
    // Through the CSSOM: the Content-Security-Policy refuses style attributes.
    else if (k === 'style') el.style.cssText = v;
    else if (k === 'class') el.setAttribute('class', v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
}

function appendAll(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
}

/** Replaces `el`'s children; null, undefined and false children are skipped. */
function fill(el, ...children) {
  el.replaceChildren();
  appendAll(el, children);
}

const $ = (sel, root = document) => root.querySelector(sel);

let idCounter = 0;
const uid = (prefix) => `${prefix}-${++idCounter}`;

const NUMERIC_COLUMNS = new Set(['Processes', 'Speed', 'Cores', 'Position', 'Weight', 'Share', 'Supersteps', 'Records', 'Bytes', 'Size']);
/** A column header; numeric columns are right-aligned like their cells. */
const colHead = (t) => h('th', { scope: 'col', class: NUMERIC_COLUMNS.has(t) ? 'num' : null }, t);

/** A table inside a horizontally scrollable, keyboard-focusable region. */
function scrollTable(label, table) {
  return h('div', { class: 'table-wrap', role: 'region', 'aria-label': label, tabindex: 0 }, table);
}

/** Makes `parent`'s children exactly `nodes`, moving as few nodes as possible (keeps focus). */
function reconcile(parent, nodes) {
  nodes.forEach((node, i) => {
    if (parent.children[i] !== node) parent.insertBefore(node, parent.children[i] || null);
  });
  while (parent.children.length > nodes.length) parent.lastElementChild.remove();
}

// ------------------------------------------------------------------ formatting

function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = -1;
  do {
    v /= 1024;
    i++;
  } while (v >= 1024 && i < units.length - 1);
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

function fmtTime(ms) {
  if (ms === null || ms === undefined) return '—';
  const d = new Date(ms);
  const today = new Date();
  const time = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  if (d.toDateString() === today.toDateString()) return time;
  return `${d.toLocaleDateString()} ${time}`;
}

function fmtDuration(ms) {
  if (ms === null || ms === undefined || ms < 0) return '—';
  const s = ms / 1000;
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 60) return `${Math.round(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s - m * 60)} s`;
  const hrs = Math.floor(m / 60);
  return `${hrs} h ${m % 60} min`;
}

function fmtRelative(ms) {
  const diff = ms - Date.now();
  const abs = Math.abs(diff);
  const txt = fmtDuration(abs);
  return diff >= 0 ? `in ${txt}` : `${txt} ago`;
}

const pct = (x) => `${(x * 100).toFixed(x < 0.1 ? 1 : 0)} %`;
const shortHash = (hash) => (hash ? hash.slice(0, 12) : '');

function timeEl(ms, text) {
  if (ms === null || ms === undefined) return '—';
  return h('time', { datetime: new Date(ms).toISOString(), title: new Date(ms).toLocaleString() }, text ?? fmtTime(ms));
}

function jobStateText(job) {
  if (job.state === 'finished') return job.outcome ? `finished: ${job.outcome}` : 'finished';
  return job.state;
}

function stateBadge(job) {
  const cls = job.state === 'finished' ? `badge outcome-${job.outcome || 'unknown'}` : `badge state-${job.state}`;
  return h('span', { class: cls }, jobStateText(job));
}

function b64ToBytes(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** The MIME type of the picture format whose magic bytes `b` starts with (PNG, JPEG, GIF, WebP), else null. */
function pictureType(b) {
  const at = (off, ...sig) => b.length >= off + sig.length && sig.every((v, i) => b[off + i] === v);
  if (at(0, 0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a)) return 'image/png';
  if (at(0, 0xff, 0xd8, 0xff)) return 'image/jpeg';
  if (at(0, 0x47, 0x49, 0x46, 0x38) && (b[4] === 0x37 || b[4] === 0x39) && b[5] === 0x61) return 'image/gif'; // GIF87a, GIF89a
  if (at(0, 0x52, 0x49, 0x46, 0x46) && at(8, 0x57, 0x45, 0x42, 0x50)) return 'image/webp'; // RIFF....WEBP
  return null;
}

// ------------------------------------------------------------ session & alerts

let session = loadSession();
let expiryTimer = null;

function loadSession() {
  try {
    const s = JSON.parse(sessionStorage.getItem(SESSION_KEY) || 'null');
    if (s && s.token && (!s.expires_at || s.expires_at * 1000 > Date.now())) return s;
  } catch {
    // fall through: no usable session
  }
  sessionStorage.removeItem(SESSION_KEY);
  return null;
}

function saveSession(s) {
  session = s;
  if (s) sessionStorage.setItem(SESSION_KEY, JSON.stringify(s));
  else sessionStorage.removeItem(SESSION_KEY);
  clearTimeout(expiryTimer);
  if (s && s.expires_at) {
    const left = s.expires_at * 1000 - Date.now();
    // setTimeout overflows beyond ~24.8 days; tokens are shorter-lived than that.
    if (left < 2 ** 31 - 1) expiryTimer = setTimeout(() => sessionEnded('Your session has expired; sign in again.'), Math.max(0, left));
  }
  updateChrome();
}

let signInMessage = '';
let returnTo = '';

function sessionEnded(message) {
  if (!session) return;
  saveSession(null);
  userEvents.stop();
  signInMessage = message;
  returnTo = location.hash;
  render();
}

let alertSource = null;

/** Shows an error in the page's alert region. `source` lets a later success clear it. */
function showError(err, source = null) {
  if (!err || err.name === 'AbortError' || err.code === 'unauthorized_handled') return;
  const box = $('#alert');
  const message = err instanceof Error ? err.message : String(err);
  $('#alert-text').textContent = message;
  box.hidden = false;
  alertSource = source;
}

function clearError(source = undefined) {
  if (source !== undefined && alertSource !== source) return;
  $('#alert').hidden = true;
  $('#alert-text').textContent = '';
  alertSource = null;
}

let noticeTimer = null;
/** A polite announcement (and a visible toast) for things that went well. */
function notify(text) {
  const el = $('#notice');
  el.textContent = text;
  el.classList.add('shown');
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => {
    el.classList.remove('shown');
    el.textContent = '';
  }, 6000);
}

// ------------------------------------------------------------------------ API

class ApiFailure extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authHeaders() {
  return session ? { Authorization: `Bearer ${session.token}` } : {};
}

async function readApiError(res) {
  let code = `http_${res.status}`;
  let message = `the supernode answered ${res.status} ${res.statusText}`.trim();
  try {
    const text = await res.text();
    try {
      const body = JSON.parse(text);
      if (body && typeof body.message === 'string') {
        message = body.message;
        code = body.code || code;
      }
    } catch {
      if (text.trim()) message = `${message}: ${text.trim().slice(0, 300)}`;
    }
  } catch {
    // keep the generic message
  }
  return new ApiFailure(res.status, code, message);
}

/**
 * Calls the API. `json`: a body sent as JSON; `body` + `contentType`: a raw body.
 * Throws ApiFailure with the server's ApiError message on failure.
 */
async function api(method, path, { json, body, contentType, signal } = {}) {
  const headers = { ...authHeaders(), Accept: 'application/json' };
  let payload = body;
  if (json !== undefined) {
    headers['Content-Type'] = 'application/json';
    payload = JSON.stringify(json);
  } else if (contentType) {
    headers['Content-Type'] = contentType;
  }
  let res;
  try {
    res = await fetch(API + path, { method, headers, body: payload, signal, cache: 'no-store' });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiFailure(0, 'network', `Cannot reach the supernode (${e.message}). Is it running?`);
  }
  if (res.status === 401 && path !== '/login' && session) {
    const err = await readApiError(res);
    // A wrong current password is the form's error, not the session's end.
    if (err.code === 'wrong_password') throw err;
    sessionEnded(`Signed out: ${err.message}. Sign in again.`);
    throw new ApiFailure(401, 'unauthorized_handled', err.message);
  }
  if (!res.ok) throw await readApiError(res);
  if (res.status === 204) return null;
  return res.json();
}

// ------------------------------------------------------------------------ SSE

/** Every live stream, so a test (or a debugging person) can drop them all: window.bspweb.reconnectStreams(). */
const liveStreams = new Set();
/** While true, pages skip their timed checks (see makeCtx().poll); updates then come from the event streams alone. */
let pollingPaused = false;
/** How many timed checks ran, so a test can tell none ran while polling was paused. */
let timedChecks = 0;
window.bspweb = {
  reconnectStreams() {
    for (const s of liveStreams) s.dropConnection();
    return liveStreams.size;
  },
  /**
   * Pauses (true) or resumes (false) the timed checks of every page, so a
   * test can tell that a live update came from an event stream. Refreshes
   * the streams ask for still run.
   */
  pausePolling(paused = true) {
    pollingPaused = Boolean(paused);
    return pollingPaused;
  },
  /** The number of timed checks run so far. */
  timedChecks() {
    return timedChecks;
  },
};

/**
 * Parses a text/event-stream body, calling `dispatch({id, event, data})` per event.
 * `state.lastId` is the id of the last complete event, kept across connections.
 */
async function readEventStream(body, state, dispatch) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let data = [];
  let event = '';
  let idBuffer = state.lastId;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line === '') {
          // Only a complete event moves the id a reconnect resumes from: an
          // event cut off mid-way must be sent again.
          state.lastId = idBuffer;
          if (data.length > 0) dispatch({ id: state.lastId, event: event || 'message', data: data.join('\n') });
          data = [];
          event = '';
          continue;
        }
        if (line.startsWith(':')) continue; // a comment (keep-alive)
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? '' : line.slice(colon + 1);
        if (val.startsWith(' ')) val = val.slice(1);
        if (field === 'data') data.push(val);
        else if (field === 'event') event = val;
        else if (field === 'id' && !val.includes('\0')) idBuffer = val;
        else if (field === 'retry' && /^\d+$/.test(val)) state.retry = Number(val);
      }
    }
  } finally {
    reader.releaseLock?.();
  }
}

/**
 * Follows an SSE endpoint until `signal` aborts or `onClosed()` says to stop.
 * Reconnects with Last-Event-ID after network errors and early ends.
 *   onEvent(ev)       every event (dedupe by id is the caller's job)
 *   onStatus(status)  'connecting' | 'live' | 'retrying' | 'unsupported' | 'ended'
 *   onClosed()        after a stream ended: resolve true to reconnect
 *   retryUnsupported  ms after which to try again an endpoint that answered 404
 */
async function followSse(path, { signal, lastId = null, onEvent, onStatus = () => {}, onClosed = async () => true, retryUnsupported = 0 }) {
  const state = { lastId: lastId === null ? null : String(lastId), retry: 1000 };
  let backoff = 500;
  let conn = null;
  const handle = {
    dropConnection() {
      conn?.abort();
    },
  };
  liveStreams.add(handle);
  const sleep = (ms) =>
    new Promise((resolve) => {
      const t = setTimeout(resolve, ms);
      signal.addEventListener('abort', () => {
        clearTimeout(t);
        resolve();
      }, { once: true });
    });
  try {
    while (!signal.aborted) {
      conn = new AbortController();
      const onAbort = () => conn.abort();
      signal.addEventListener('abort', onAbort, { once: true });
      onStatus('connecting');
      let res = null;
      try {
        const headers = { ...authHeaders(), Accept: 'text/event-stream' };
        if (state.lastId !== null && state.lastId !== '') headers['Last-Event-ID'] = state.lastId;
        res = await fetch(API + path, { headers, signal: conn.signal, cache: 'no-store' });
        if (res.status === 401) {
          const err = await readApiError(res);
          sessionEnded(`Signed out: ${err.message}. Sign in again.`);
          return 'unauthorized';
        }
        if (res.status === 404 || res.status === 405) {
          const err = await readApiError(res);
          onStatus('unsupported', err);
          if (!retryUnsupported) return 'unsupported';
          await sleep(retryUnsupported);
          continue;
        }
        if (!res.ok) throw await readApiError(res);
        onStatus('live');
        backoff = 500;
        await readEventStream(res.body, state, onEvent);
      } catch (e) {
        if (signal.aborted) return 'aborted';
        if (!conn.signal.aborted) {
          // A network error or a failing server: try again, slower each time.
          onStatus('retrying', e);
          await sleep(backoff);
          backoff = Math.min(backoff * 2, 15000);
          continue;
        }
        // Our own dropConnection(): reconnect at once.
      } finally {
        signal.removeEventListener('abort', onAbort);
      }
      if (signal.aborted) return 'aborted';
      if (conn.signal.aborted) continue;
      // The server ended the stream.
      let again = true;
      try {
        again = await onClosed();
      } catch (e) {
        if (signal.aborted) return 'aborted';
        again = true;
      }
      if (!again) {
        onStatus('ended');
        return 'ended';
      }
      onStatus('retrying');
      await sleep(Math.max(state.retry, backoff));
      backoff = Math.min(backoff * 2, 15000);
    }
    return 'aborted';
  } finally {
    liveStreams.delete(handle);
  }
}

// ------------------------------------------------- the user's job-list stream

const userEvents = {
  ac: null,
  status: 'off',
  listeners: new Set(),
  statusListeners: new Set(),
  start() {
    if (this.ac) return;
    this.ac = new AbortController();
    followSse('/events', {
      signal: this.ac.signal,
      retryUnsupported: 30000,
      onStatus: (st) => {
        const reconnected = st === 'live' && this.status !== 'live';
        this.status = st;
        for (const f of this.statusListeners) f(st);
        // Events may have been missed while disconnected: refresh everything.
        if (reconnected) for (const f of this.listeners) f(null);
      },
      onEvent: (ev) => {
        let change = null;
        try {
          change = JSON.parse(ev.data);
        } catch {
          return;
        }
        for (const f of this.listeners) f(change);
      },
    });
  },
  stop() {
    this.ac?.abort();
    this.ac = null;
    this.status = 'off';
  },
  /** Calls `f(JobListChanged | null)`; returns the unsubscribe function. */
  subscribe(f) {
    this.listeners.add(f);
    return () => this.listeners.delete(f);
  },
  onStatus(f) {
    this.statusListeners.add(f);
    f(this.status);
    return () => this.statusListeners.delete(f);
  },
};

function liveStatusText(st) {
  switch (st) {
    case 'live':
      return `Live: updates stream from the supernode (and a check every ${LIST_POLL_MS / 1000} s).`;
    case 'unsupported':
      return `Checking for changes every ${LIST_POLL_MS / 1000} s (this supernode has no event stream).`;
    case 'retrying':
      return `Reconnecting to the event stream; checking every ${LIST_POLL_MS / 1000} s meanwhile.`;
    default:
      return 'Connecting to the event stream…';
  }
}

// -------------------------------------------------------------------- routing

let page = null; // { dispose() }

function makeCtx() {
  const ac = new AbortController();
  const cleanups = [];
  return {
    signal: ac.signal,
    onCleanup(f) {
      cleanups.push(f);
    },
    /**
     * Runs `fn` now and then every `ms` (never overlapping; the timed runs are
     * skipped while window.bspweb.pausePolling(true) is in force); returns a
     * function that runs it again at once. `fn` may return false to stop polling.
     */
    poll(ms, fn, source) {
      let timer = null;
      let running = false;
      let again = false;
      let stopped = false;
      const tick = () => {
        if (pollingPaused) {
          timer = setTimeout(tick, ms);
        } else {
          timedChecks++;
          run();
        }
      };
      const run = async () => {
        if (ac.signal.aborted || stopped) return;
        if (running) {
          again = true;
          return;
        }
        running = true;
        clearTimeout(timer);
        let keep = true;
        try {
          keep = (await fn()) !== false;
          clearError(source);
        } catch (e) {
          if (e.name !== 'AbortError') showError(e, source);
          if (e.stopPolling) keep = false;
        } finally {
          running = false;
          if (!keep) stopped = true;
          if (!ac.signal.aborted && !stopped) {
            if (again) {
              again = false;
              run();
            } else {
              timer = setTimeout(tick, ms);
            }
          }
        }
      };
      cleanups.push(() => clearTimeout(timer));
      run();
      return () => {
        stopped = false;
        run();
      };
    },
    dispose() {
      ac.abort();
      for (const f of cleanups) {
        try {
          f();
        } catch {
          // ignore
        }
      }
    },
  };
}

/**
 * The page and its parameters from the URL hash (#/path?query). The path's
 * segments are decoded one by one and the query by URLSearchParams, so `&`,
 * `=`, `+` and `%` inside a value survive; `bad` is true when the path has a
 * malformed %-escape.
 */
function parseHash() {
  const raw = location.hash.replace(/^#/, '');
  const q = raw.indexOf('?');
  const rawPath = (q < 0 ? raw : raw.slice(0, q)).replace(/\/+$/, '') || '/jobs';
  const params = new URLSearchParams(q < 0 ? '' : raw.slice(q + 1));
  try {
    return { path: rawPath.split('/').map(decodeURIComponent).join('/'), params, bad: false };
  } catch {
    return { path: rawPath, params, bad: true };
  }
}

const ROUTES = [
  [/^\/jobs$/, 'jobs', jobsPage],
  [/^\/jobs\/(\d+)$/, 'jobs', jobPage],
  [/^\/submit$/, 'submit', submitPage],
  [/^\/programs$/, 'programs', programsPage],
  [/^\/peers$/, 'peers', peersPage],
  [/^\/account$/, 'account', accountPage],
  [/^\/users$/, 'users', usersPage],
];

function render() {
  page?.dispose();
  page = null;
  clearError(); // an error belongs to the page it happened on
  const main = $('#main');
  fill(main);
  main.setAttribute('aria-busy', 'false');
  updateChrome();
  if (!session) {
    signInPage(main);
    return;
  }
  userEvents.start();
  const { path, params, bad } = parseHash();
  for (const [re, nav, fn] of ROUTES) {
    const m = bad ? null : re.exec(path);
    if (!m) continue;
    markNav(nav);
    const ctx = makeCtx();
    page = ctx;
    fn(main, ctx, params, ...m.slice(1));
    focusHeading(main);
    return;
  }
  markNav(null);
  main.append(
    h('h1', { tabindex: -1 }, 'Page not found'),
    bad
      ? h('p', { id: 'bad-link' }, 'The link ', h('code', {}, location.hash), ' is malformed: one of its %-escapes is not valid. ', h('a', { href: '#/jobs' }, 'Go to your jobs'), '.')
      : h('p', {}, 'There is no page at ', h('code', {}, location.hash || '/'), '. ', h('a', { href: '#/jobs' }, 'Go to your jobs'), '.'),
  );
  focusHeading(main);
}

let firstRender = true;
function focusHeading(main) {
  // Move focus to the new page's heading (not on the first load), so screen
  // readers announce the page and keyboard users start at its top.
  if (firstRender) {
    firstRender = false;
    return;
  }
  const h1 = main.querySelector('h1');
  if (h1) {
    h1.setAttribute('tabindex', '-1');
    h1.focus({ preventScroll: false });
  }
}

function markNav(active) {
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.route === active) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

function updateChrome() {
  $('#nav').hidden = !session;
  $('#account').hidden = !session;
  $('#account-name').textContent = session ? `Signed in as ${session.user?.name ?? ''}` : '';
  // Only administrators manage accounts; volunteers run no jobs.
  $('#nav-users').hidden = !(session?.user?.role === 'admin' || session?.user?.admin);
  $('#nav a[data-route="submit"]').parentElement.hidden = session?.user?.role === 'volunteer';
}

function go(hash) {
  if (location.hash === hash) render();
  else location.hash = hash;
}

// -------------------------------------------------------------------- sign in

function signInPage(main) {
  markNav(null);
  const errId = uid('signin-error');
  const err = h('p', { id: errId, class: 'form-error', role: 'alert', hidden: !signInMessage, text: signInMessage });
  const name = h('input', { id: 'signin-name', name: 'username', autocomplete: 'username', required: true, autocapitalize: 'none', spellcheck: 'false' });
  const password = h('input', { id: 'signin-password', name: 'password', type: 'password', autocomplete: 'current-password', required: true });
  const button = h('button', { type: 'submit' }, 'Sign in');
  const form = h(
    'form',
    { class: 'card narrow', 'aria-describedby': errId, novalidate: true },
    h('div', { class: 'field' }, h('label', { for: 'signin-name' }, 'User name'), name),
    h('div', { class: 'field' }, h('label', { for: 'signin-password' }, 'Password'), password),
    err,
    h('div', { class: 'actions' }, button),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (!name.value.trim() || !password.value) {
      err.textContent = 'Enter your user name and password.';
      err.hidden = false;
      (name.value.trim() ? password : name).focus();
      return;
    }
    button.disabled = true;
    button.textContent = 'Signing in…';
    try {
      const res = await api('POST', '/login', { json: { name: name.value.trim(), password: password.value } });
      signInMessage = '';
      clearError();
      saveSession({ token: res.token, expires_at: res.expires_at, user: res.user });
      const target = returnTo && returnTo !== '#' ? returnTo : '#/jobs';
      returnTo = '';
      notify(`Signed in as ${res.user.name}.`);
      go(target);
    } catch (e2) {
      err.textContent = e2.status === 401 ? `Cannot sign in: ${e2.message}.` : e2.message;
      err.hidden = false;
      password.select();
      password.focus();
    } finally {
      button.disabled = false;
      button.textContent = 'Sign in';
    }
  });
  main.append(
    h('h1', {}, 'Sign in'),
    h('p', { class: 'lead' }, 'Run bulk-synchronous parallel programs on volunteer peers. Sign in with your bspweb account (', h('code', {}, 'bspweb up'), ' prints the first one).'),
    form,
  );
  setTimeout(() => name.focus(), 0);
}

// ----------------------------------------------------------------------- jobs

const JOB_STATES = [
  ['waiting', 'Waiting', 'Accepted and waiting for peers.'],
  ['active', 'Active', 'Placed on peers and running.'],
  ['finished', 'Finished', 'Over: exited, aborted, failed or killed.'],
];

async function killJob(job, after) {
  if (!confirm(`Kill job ${job.id} (${job.program})? Its processes stop at once.`)) return;
  try {
    await api('POST', `/jobs/${job.id}/kill`);
    notify(`Job ${job.id} killed.`);
    clearError();
  } catch (e) {
    showError(e);
  }
  after?.();
}

async function disposeJob(job, after) {
  if (!confirm(`Delete job ${job.id} (${job.program}) and all its output?`)) return false;
  try {
    await api('DELETE', `/jobs/${job.id}`);
    notify(`Job ${job.id} deleted.`);
    clearError();
    after?.();
    return true;
  } catch (e) {
    showError(e);
    after?.();
    return false;
  }
}

function jobsPage(main, ctx) {
  const liveText = h('p', { class: 'muted small', id: 'live-status' });
  ctx.onCleanup(
    userEvents.onStatus((st) => {
      liveText.textContent = liveStatusText(st);
      liveText.dataset.status = st;
    }),
  );

  const sections = {};
  const rowCache = new Map(); // job id -> { key, row }
  const known = new Map(); // job id -> state text, for announcements
  let firstLoad = true;

  main.append(
    h('div', { class: 'page-head' }, h('h1', {}, 'Jobs'), h('a', { class: 'button', href: '#/submit' }, 'Submit a job')),
    liveText,
  );
  for (const [state, title, help] of JOB_STATES) {
    const headId = `jobs-${state}-heading`;
    const count = h('span', { class: 'count' });
    const tbody = h('tbody');
    const empty = h('p', { class: 'empty muted' }, `No ${title.toLowerCase()} jobs.`);
    const table = h(
      'table',
      { class: 'jobs', id: `jobs-${state}` },
      h('caption', { class: 'visually-hidden' }, `${title} jobs`),
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          ['Job', 'Program', 'Processes', 'State', state === 'waiting' ? 'Submitted' : state === 'active' ? 'Started' : 'Finished', state === 'finished' ? 'Ran for' : 'Progress', 'Actions'].map((t) =>
            colHead(t),
          ),
        ),
      ),
      tbody,
    );
    const wrap = scrollTable(`${title} jobs`, table);
    sections[state] = { count, tbody, empty, wrap };
    main.append(h('section', { class: 'jobs-section', 'aria-labelledby': headId, dataset: { state } }, h('h2', { id: headId }, title, ' ', count), h('p', { class: 'muted small' }, help), empty, wrap));
  }

  function jobRow(job) {
    const key = JSON.stringify([job.state, job.outcome, job.exited, job.supersteps, job.started_at, job.finished_at, job.description, job.error]);
    const cached = rowCache.get(job.id);
    if (cached && cached.key === key) return cached.row;
    let timeCell;
    let progressCell;
    if (job.state === 'waiting') {
      timeCell = timeEl(job.submitted_at);
      progressCell = 'waiting for peers';
    } else if (job.state === 'active') {
      timeCell = timeEl(job.started_at);
      const steps = job.supersteps?.length ? Math.max(...job.supersteps) : null;
      progressCell = `${job.exited}/${job.nprocs} exited${steps !== null ? `, superstep ${steps}` : ''}`;
    } else {
      timeCell = timeEl(job.finished_at);
      progressCell = job.started_at && job.finished_at ? fmtDuration(job.finished_at - job.started_at) : '—';
    }
    const actions = h('div', { class: 'row-actions' });
    if (job.state !== 'finished') {
      actions.append(h('button', { type: 'button', class: 'danger small-btn', 'aria-label': `Kill job ${job.id}`, onclick: () => killJob(job, refresh) }, 'Kill'));
    } else {
      actions.append(h('button', { type: 'button', class: 'secondary small-btn', 'aria-label': `Delete job ${job.id}`, onclick: () => disposeJob(job, refresh) }, 'Delete'));
    }
    const row = h(
      'tr',
      { dataset: { job: job.id } },
      h('th', { scope: 'row' }, h('a', { href: `#/jobs/${job.id}` }, `Job ${job.id}`)),
      h('td', {}, h('span', { class: 'prog' }, job.program), job.description ? h('span', { class: 'desc muted' }, job.description) : null),
      h('td', { class: 'num' }, job.nprocs),
      h('td', {}, stateBadge(job), job.error ? h('span', { class: 'desc error-text' }, job.error) : null),
      h('td', {}, timeCell),
      h('td', {}, progressCell),
      h('td', {}, actions),
    );
    rowCache.set(job.id, { key, row });
    return row;
  }

  async function load() {
    const lists = await Promise.all(JOB_STATES.map(([state]) => api('GET', `/jobs?state=${state}`, { signal: ctx.signal })));
    const seen = new Set();
    JOB_STATES.forEach(([state], i) => {
      const jobs = lists[i].slice().sort((a, b) => b.id - a.id);
      const sec = sections[state];
      sec.count.textContent = `(${jobs.length})`;
      sec.empty.hidden = jobs.length > 0;
      sec.wrap.hidden = jobs.length === 0;
      reconcile(
        sec.tbody,
        jobs.map((j) => {
          seen.add(j.id);
          const text = jobStateText(j);
          if (!firstLoad && known.has(j.id) && known.get(j.id) !== text) notify(`Job ${j.id} (${j.program}) is now ${text}.`);
          known.set(j.id, text);
          return jobRow(j);
        }),
      );
    });
    for (const id of [...rowCache.keys()]) if (!seen.has(id)) rowCache.delete(id);
    firstLoad = false;
  }

  let debounce = null;
  const refresh = ctx.poll(LIST_POLL_MS, load, 'jobs');
  const unsubscribe = userEvents.subscribe(() => {
    clearTimeout(debounce);
    debounce = setTimeout(refresh, 150);
  });
  ctx.onCleanup(() => {
    unsubscribe();
    clearTimeout(debounce);
  });
}

// -------------------------------------------------------------------- one job

const STREAMS = [
  ['stdout', 'Standard output'],
  ['stderr', 'Standard error'],
  ['status', 'System status'],
];

let programsCache = null;
async function programsList(signal) {
  if (!programsCache) programsCache = api('GET', '/programs', { signal }).catch((e) => {
    programsCache = null;
    throw e;
  });
  return programsCache;
}

async function isMandelbrot(job, signal) {
  if (job.program === 'mandelbrot') return true;
  try {
    const progs = await programsList(signal);
    return progs.some((p) => p.builtin && p.name === 'mandelbrot' && p.hash === job.program_hash);
  } catch {
    return false;
  }
}

function imageSize(args) {
  const a = args && typeof args === 'object' && !Array.isArray(args) ? args : {};
  const width = Number.isInteger(a.width) ? a.width : 256;
  const height = Number.isInteger(a.height) ? a.height : 256;
  return { width, height };
}

function jobPage(main, ctx, _params, idText) {
  const id = Number(idText);
  let job = null;
  let done = false; // the terminal event arrived
  let lastId = 0;
  let lines = []; // { id, pid, kind, text, at }, the newest MAX_KEPT_LINES
  let droppedLines = 0; // older lines no longer kept
  const procState = new Map(); // pid -> text
  const raw = new Map(); // pid -> { chunks: Uint8Array[], bytes, records }
  let image = null; // { width, height, ctx2d, rows: Set, pending: Map(pid -> Uint8Array) }
  let imageDecided = false;
  let earlyRaw = []; // raw events that arrived before we knew whether it is an image
  let peersById = new Map();
  let lastIdAtClose = 0;
  let closesWithoutNews = 0;

  const title = h('h1', {}, `Job ${id}`);
  const stateLine = h('p', { class: 'job-state', id: 'job-state' }, 'Loading…');
  const actions = h('div', { class: 'actions' });
  const facts = h('dl', { class: 'facts' });
  const streamStatus = h('span', { class: 'stream-status muted small', id: 'stream-status' }, 'Connecting…');
  // The one live region of the page: job-level changes only (started,
  // finished, the image complete), not every output line or event.
  const announcer = h('p', { class: 'visually-hidden', id: 'job-announce', role: 'status', 'aria-atomic': 'true' });
  let announcedState = null;
  const announce = (text) => {
    announcer.textContent = text;
  };

  // Progress
  const progressBody = h('tbody');
  const progressNote = h('p', { class: 'muted small' });
  const progressSection = h(
    'section',
    { 'aria-labelledby': 'progress-heading' },
    h('h2', { id: 'progress-heading' }, 'Progress per process'),
    progressNote,
    scrollTable(
      'Progress per process',
      h(
        'table',
        { id: 'progress' },
        h('thead', {}, h('tr', {}, ['Pid', 'Peer', 'Supersteps', '', 'State'].map((t, i) => h('th', { scope: 'col', class: i === 3 ? 'bar-col' : i === 2 ? 'num' : null }, t || h('span', { class: 'visually-hidden' }, 'Progress bar'))))),
        progressBody,
      ),
    ),
  );

  // Output
  const pidSelect = h('select', { id: 'filter-pid' }, h('option', { value: '' }, 'All processes'));
  const streamBoxes = STREAMS.map(([kind, label]) => {
    const box = h('input', { type: 'checkbox', id: `filter-${kind}`, checked: true, value: kind });
    return { kind, box, el: h('label', { class: 'check' }, box, ` ${label}`) };
  });
  const followBox = h('input', { type: 'checkbox', id: 'follow-output', checked: true });
  // role=log without live announcements: a busy job prints far more lines
  // than anyone can listen to; state changes are announced by `announcer`.
  const log = h('div', { id: 'output', class: 'log', role: 'log', 'aria-live': 'off', 'aria-label': 'Job output', tabindex: 0 });
  const outputCount = h('span', { class: 'muted small', id: 'output-count' });
  const droppedNote = h('p', { class: 'muted small', id: 'output-dropped', hidden: true });
  const downloadBtn = h('button', { type: 'button', class: 'secondary', onclick: downloadOutput }, 'Download output');
  const outputSection = h(
    'section',
    { 'aria-labelledby': 'output-heading' },
    h('div', { class: 'section-head' }, h('h2', { id: 'output-heading' }, 'Output'), streamStatus),
    h(
      'form',
      { class: 'filters', onsubmit: (e) => e.preventDefault(), 'aria-label': 'Output filters' },
      h('div', { class: 'field inline' }, h('label', { for: 'filter-pid' }, 'Process'), pidSelect),
      h('fieldset', { class: 'streams' }, h('legend', {}, 'Streams'), streamBoxes.map((b) => b.el)),
      h('label', { class: 'check' }, followBox, ' Keep scrolled to the newest line'),
    ),
    log,
    h('div', { class: 'log-foot' }, outputCount, downloadBtn),
    droppedNote,
  );

  // Image
  const canvas = h('canvas', { id: 'raw-canvas', class: 'raw-canvas', role: 'img', 'aria-label': 'Image drawn from the raw output' });
  const imageNote = h('p', { class: 'muted small', id: 'image-status' });
  const contrastBox = h('input', { type: 'checkbox', id: 'image-contrast', checked: true });
  const imageSection = h(
    'section',
    { 'aria-labelledby': 'image-heading', hidden: true, id: 'image-section' },
    h('h2', { id: 'image-heading' }, 'Image'),
    h('p', { class: 'muted small' }, 'The raw records (a 4-byte row index, then one grey byte per pixel) drawn row by row as they arrive.'),
    imageNote,
    h('p', {}, h('label', { class: 'check' }, contrastBox, ' Stretch the contrast of dark pixels')),
    h('div', { class: 'canvas-wrap' }, canvas),
  );

  // Raw records that are pictures (PNG, JPEG, GIF, WebP)
  const pictureList = h('ul', { class: 'pictures', id: 'pictures' });
  const picturesNote = h('p', { class: 'muted small', id: 'pictures-note' });
  const picturesSection = h(
    'section',
    { 'aria-labelledby': 'pictures-heading', hidden: true, id: 'pictures-section' },
    h('h2', { id: 'pictures-heading' }, 'Pictures'),
    h('p', { class: 'muted small' }, 'Raw records in an image format (PNG, JPEG, GIF or WebP), in the order they arrived.'),
    picturesNote,
    pictureList,
  );
  const pictureUrls = [];
  let pictureCount = 0;
  ctx.onCleanup(() => {
    for (const url of pictureUrls) URL.revokeObjectURL(url);
    pictureUrls.length = 0;
  });

  // Raw data (not an image)
  const rawBody = h('tbody');
  const rawSection = h(
    'section',
    { 'aria-labelledby': 'raw-heading', hidden: true, id: 'raw-section' },
    h('h2', { id: 'raw-heading' }, 'Raw data'),
    h('p', { class: 'muted small' }, 'Bytes the processes wrote with write_raw, per process.'),
    scrollTable('Raw data per process', h('table', {}, h('thead', {}, h('tr', {}, ['Pid', 'Records', 'Bytes', 'First bytes', ''].map((t) => colHead(t)))), rawBody)),
  );

  // Timeline
  const timeline = h('ol', { class: 'timeline', id: 'timeline' });
  const timelineSection = h('section', { 'aria-labelledby': 'timeline-heading' }, h('h2', { id: 'timeline-heading' }, 'Events'), timeline);

  main.append(
    h('p', { class: 'crumbs' }, h('a', { href: '#/jobs' }, '← All jobs')),
    h('div', { class: 'page-head' }, title, actions),
    stateLine,
    facts,
    announcer,
    progressSection,
    imageSection,
    picturesSection,
    outputSection,
    rawSection,
    timelineSection,
  );

  // --- rendering

  function renderHead() {
    const stateText = jobStateText(job);
    // Announce changes seen after the page loaded; the terminal event (finish) announces the end itself.
    if (announcedState !== null && stateText !== announcedState && !(done && job.state === 'finished')) announce(`Job ${job.id} is now ${stateText}.`);
    announcedState = stateText;
    title.textContent = `Job ${job.id} · ${job.program}`;
    document.title = `Job ${job.id} · bspweb`;
    fill(stateLine, stateBadge(job), job.error ? h('span', { class: 'error-text' }, ` ${job.error}${job.error_pid !== null && job.error_pid !== undefined ? ` (pid ${job.error_pid})` : ''}`) : null);
    const again = new URLSearchParams({ program: job.program, nprocs: job.nprocs, args: job.args === null ? '' : JSON.stringify(job.args, null, 2) });
    if (job.description) again.set('description', job.description);
    const acts = [];
    if (job.state !== 'finished') acts.push(h('button', { type: 'button', class: 'danger', id: 'kill-job', onclick: () => killJob(job, refreshJob) }, 'Kill job'));
    else
      acts.push(
        h('button', {
          type: 'button',
          class: 'secondary',
          id: 'dispose-job',
          onclick: async () => {
            if (await disposeJob(job)) go('#/jobs');
          },
        }, 'Delete job'),
      );
    acts.push(h('a', { class: 'button secondary', href: `#/submit?${again}` }, 'Submit again'));
    reconcileActions(acts);
    const dd = (label, ...value) => [h('dt', {}, label), h('dd', {}, ...value)];
    fill(facts,
      ...dd('Program', job.program, ' ', h('code', { title: job.program_hash }, shortHash(job.program_hash))),
      ...dd('Processes', String(job.nprocs)),
      ...dd('Arguments', h('code', {}, JSON.stringify(job.args))),
      ...(job.description ? dd('Description', job.description) : []),
      ...dd('Submitted', timeEl(job.submitted_at)),
      ...dd('Started', timeEl(job.started_at)),
      ...dd('Finished', timeEl(job.finished_at)),
      ...(job.started_at ? dd('Running time', fmtDuration((job.finished_at ?? Date.now()) - job.started_at)) : []),
      ...dd('Seed', String(job.seed)),
    );
    // pid filter options
    if (pidSelect.options.length !== job.nprocs + 1) {
      const cur = pidSelect.value;
      fill(pidSelect, h('option', { value: '' }, 'All processes'), ...Array.from({ length: job.nprocs }, (_, p) => h('option', { value: String(p) }, `pid ${p}`)));
      pidSelect.value = cur;
    }
    renderProgress();
  }

  let lastActionsKey = '';
  function reconcileActions(acts) {
    const key = `${job.state}`;
    if (key === lastActionsKey) return;
    lastActionsKey = key;
    fill(actions, ...acts);
  }

  function renderProgress() {
    if (!job) return;
    const steps = job.supersteps || [];
    const max = Math.max(1, ...steps);
    if (job.state === 'waiting') progressNote.textContent = 'The job waits for peers; no process runs yet.';
    else if (steps.length === 0) progressNote.textContent = 'This supernode reports no per-process progress.';
    else progressNote.textContent = job.state === 'active' ? `Completed supersteps per process, updated every ${JOB_POLL_MS / 1000} s (peers report a few times a second); the bars compare each process with the furthest one.` : 'Completed supersteps per process.';
    const rows = [];
    for (let p = 0; p < job.nprocs; p++) {
      const n = steps[p];
      const peer = job.placement?.[p];
      const peerName = peer === undefined ? '—' : peersById.get(String(peer))?.name ?? `peer ${peer}`;
      const bar = n === undefined ? '' : h('div', { class: 'bar', 'aria-hidden': 'true' }, h('div', { class: 'bar-fill', style: `width:${(100 * n) / max}%` }));
      rows.push(
        h(
          'tr',
          { dataset: { pid: p } },
          h('th', { scope: 'row' }, String(p)),
          h('td', { class: 'nowrap' }, peerName),
          h('td', { class: 'num supersteps' }, n === undefined ? '—' : String(n)),
          h('td', { class: 'bar-col' }, bar),
          h('td', {}, procState.get(p) ?? (job.state === 'active' ? 'running' : job.state === 'waiting' ? 'waiting' : job.outcome === 'exited' ? 'exited' : 'stopped')),
        ),
      );
    }
    // Rebuilding a small table is cheap; big jobs are capped for the DOM's sake.
    fill(progressBody, ...rows.slice(0, 1024));
    if (rows.length > 1024) progressBody.append(h('tr', {}, h('td', { colspan: 5 }, `… and ${rows.length - 1024} more processes`)));
  }

  // --- output

  const filters = () => ({
    pid: pidSelect.value === '' ? null : Number(pidSelect.value),
    kinds: new Set(streamBoxes.filter((b) => b.box.checked).map((b) => b.kind)),
  });
  let shownCount = 0;

  function matches(line, f) {
    return f.kinds.has(line.kind) && (f.pid === null || line.pid === f.pid || (line.pid === null && line.kind === 'status'));
  }

  function lineEl(line) {
    return h(
      'div',
      { class: `line ${line.kind}`, dataset: { id: line.id, pid: line.pid ?? '', kind: line.kind } },
      h('span', { class: 'pid', 'aria-hidden': line.pid === null ? 'true' : null }, line.pid === null ? '[*]' : `[${line.pid}]`),
      line.kind === 'stdout' ? null : h('span', { class: 'visually-hidden' }, `${line.kind}: `),
      ' ',
      line.text,
    );
  }

  let droppedShown = 0;
  function updateCount() {
    const total = lines.length;
    outputCount.textContent = `${shownCount < total ? `${Math.min(shownCount, MAX_SHOWN_LINES)} of ` : ''}${total} line${total === 1 ? '' : 's'}${shownCount > MAX_SHOWN_LINES ? ` (only the newest ${MAX_SHOWN_LINES} shown; download for all)` : ''}`;
    if (droppedLines !== droppedShown) {
      droppedShown = droppedLines;
      droppedNote.hidden = false;
      fill(droppedNote,
        `The oldest ${droppedLines} lines were dropped to save memory: this page keeps at most the newest ${MAX_KEPT_LINES} (and Download output saves those). All of them: `,
        h('code', {}, `bspweb logs ${id}`),
        ', or the job’s event stream from its start in the ',
        h('a', { href: '/api/docs#tag-jobs' }, 'REST API'),
        ' (',
        h('code', {}, `GET /api/v1/jobs/${id}/events`),
        ').',
      );
    }
  }

  function rerenderLog() {
    const f = filters();
    const shown = lines.filter((l) => matches(l, f));
    shownCount = shown.length;
    fill(log, ...shown.slice(-MAX_SHOWN_LINES).map(lineEl));
    if (shown.length === 0) log.append(h('p', { class: 'muted empty-log' }, lines.length ? 'No lines match the filters.' : done ? 'The job printed nothing.' : 'No output yet.'));
    updateCount();
    if (followBox.checked) log.scrollTop = log.scrollHeight;
  }

  let pendingLines = [];
  let flushTimer = null;
  let recount = false; // lines were dropped: count the shown ones again
  // Adding lines costs a layout of the whole log; during a flood of lines,
  // flush less often, so that the layouts do not take all the page's time.
  let flushDelay = 40;
  function queueLine(line) {
    lines.push(line);
    // Drop the oldest lines in batches (one at a time would copy the array per line).
    if (lines.length > MAX_KEPT_LINES) {
      const drop = lines.length - Math.floor(MAX_KEPT_LINES * 0.9);
      lines = lines.slice(drop);
      droppedLines += drop;
      recount = true;
    }
    pendingLines.push(line);
    if (!flushTimer) flushTimer = setTimeout(flushLines, flushDelay);
  }
  function flushLines() {
    const t0 = performance.now();
    flushTimer = null;
    const f = filters();
    const add = pendingLines.filter((l) => matches(l, f));
    pendingLines = [];
    if (recount) {
      recount = false;
      shownCount = lines.filter((l) => matches(l, f)).length - add.length; // add.length is added below
    }
    if (add.length) {
      log.querySelector('.empty-log')?.remove();
      const frag = document.createDocumentFragment();
      for (const l of add.slice(-MAX_SHOWN_LINES)) frag.append(lineEl(l));
      log.append(frag);
      shownCount += add.length;
      while (log.childElementCount > MAX_SHOWN_LINES) log.firstElementChild.remove();
      if (followBox.checked) log.scrollTop = log.scrollHeight;
    }
    updateCount();
    flushDelay = Math.min(1000, Math.max(40, 4 * (performance.now() - t0)));
  }
  ctx.onCleanup(() => clearTimeout(flushTimer));

  pidSelect.addEventListener('change', rerenderLog);
  for (const b of streamBoxes) b.box.addEventListener('change', rerenderLog);
  followBox.addEventListener('change', () => {
    if (followBox.checked) log.scrollTop = log.scrollHeight;
  });

  function download(name, parts, type) {
    const url = URL.createObjectURL(new Blob(parts, { type }));
    const a = h('a', { href: url, download: name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  function downloadOutput() {
    const f = filters();
    const text = lines
      .filter((l) => matches(l, f))
      .map((l) => `${l.pid === null ? '[*]' : `[${l.pid}]`}${l.kind === 'stdout' ? '' : ` ${l.kind}:`} ${l.text}\n`);
    download(`job-${id}-output.txt`, text, 'text/plain');
  }

  // --- timeline

  const timelineKeys = new Set();
  function addTimeline(key, at, text, cls = '') {
    if (timelineKeys.has(key)) return;
    timelineKeys.add(key);
    const item = h('li', { class: cls, dataset: { key } }, timeEl(at), ' ', h('span', {}, text));
    // keep in time order (events arrive in order; job timestamps may come later)
    const after = [...timeline.children].find((li) => Number(li.dataset.at) > at);
    item.dataset.at = String(at ?? 0);
    timeline.insertBefore(item, after || null);
  }

  function timelineFromJob() {
    addTimeline('submitted', job.submitted_at, `Submitted: ${job.nprocs} process${job.nprocs === 1 ? '' : 'es'} of ${job.program}.`);
    if (job.started_at) addTimeline('started', job.started_at, 'Started on peers.', 'started');
  }

  // --- raw data and the image

  function rawFor(pid) {
    let r = raw.get(pid);
    if (!r) {
      r = { chunks: [], bytes: 0, records: 0, head: null };
      raw.set(pid, r);
    }
    return r;
  }

  function setupImage() {
    const { width, height } = imageSize(job.args);
    if (width < 1 || height < 1 || width * height > 64e6 || width > 32768 || height > 32768) {
      imageNote.textContent = `The image would be ${width}×${height} pixels, too big to draw here; the raw data is listed below.`;
      imageSection.hidden = false;
      return null;
    }
    canvas.width = width;
    canvas.height = height;
    canvas.setAttribute('aria-label', `Mandelbrot image, ${width}×${height} pixels, drawn row by row as the processes compute it`);
    const c2d = canvas.getContext('2d');
    c2d.fillStyle = '#1d2433';
    c2d.fillRect(0, 0, width, height);
    imageSection.hidden = false;
    return { width, height, c2d, rows: new Map(), pending: new Map() };
  }

  // Grey levels as computed, or stretched (logarithmically) so that the
  // low values — most of a Mandelbrot picture — can be told apart.
  const LINEAR = Uint8Array.from({ length: 256 }, (_, v) => v);
  const STRETCHED = Uint8Array.from({ length: 256 }, (_, v) => Math.round((255 * Math.log1p(v)) / Math.log(256)));
  const lut = () => (contrastBox.checked ? STRETCHED : LINEAR);

  function paintRow(row, pixels) {
    const map = lut();
    const data = new ImageData(image.width, 1);
    for (let x = 0; x < image.width; x++) {
      const v = map[pixels[x]];
      const o = x * 4;
      data.data[o] = v;
      data.data[o + 1] = v;
      data.data[o + 2] = v;
      data.data[o + 3] = 255;
    }
    image.c2d.putImageData(data, 0, row);
  }

  contrastBox.addEventListener('change', () => {
    if (!image) return;
    for (const [row, pixels] of image.rows) paintRow(row, pixels);
  });

  function drawRaw(pid, bytes) {
    const img = image;
    const rec = 4 + img.width;
    let buf = bytes;
    const left = img.pending.get(pid);
    if (left && left.length) {
      buf = new Uint8Array(left.length + bytes.length);
      buf.set(left);
      buf.set(bytes, left.length);
    }
    let off = 0;
    while (buf.length - off >= rec) {
      const dv = new DataView(buf.buffer, buf.byteOffset + off, 4);
      const row = dv.getUint32(0, true);
      if (row < img.height) {
        const pixels = buf.slice(off + 4, off + rec);
        img.rows.set(row, pixels);
        paintRow(row, pixels);
      }
      off += rec;
    }
    img.pending.set(pid, buf.slice(off));
    const complete = img.rows.size === img.height;
    if (complete && !imageNote.textContent.startsWith(`${img.height} of`)) announce(`The image is complete: ${img.height} rows.`);
    imageNote.textContent = `${img.rows.size} of ${img.height} rows drawn${complete ? '.' : ' so far.'}`;
  }

  /** Shows a raw record that is a picture; the object URL is revoked when the page goes. */
  function addPicture(pid, record, type, bytes) {
    pictureCount++;
    picturesSection.hidden = false;
    const format = type.slice('image/'.length).toUpperCase();
    if (pictureUrls.length >= MAX_PICTURES) {
      picturesNote.textContent = `${pictureCount} pictures; the first ${MAX_PICTURES} are shown here. The raw data below has them all.`;
      return;
    }
    const url = URL.createObjectURL(new Blob([bytes], { type }));
    pictureUrls.push(url);
    const caption = h('figcaption', { class: 'muted small' }, `pid ${pid}, record ${record}: ${format}, ${fmtBytes(bytes.length)}`);
    const img = h('img', { src: url, alt: `${format} picture written by pid ${pid} (raw record ${record})`, decoding: 'async', dataset: { pid, record } });
    img.addEventListener('error', () => caption.append(` — starts like a ${format} file but cannot be shown`), { once: true });
    pictureList.append(h('li', {}, h('figure', {}, img, caption)));
  }

  let rawRenderTimer = null;
  function handleRaw(pid, b64) {
    let bytes;
    try {
      bytes = b64ToBytes(b64);
    } catch {
      return;
    }
    const r = rawFor(pid);
    r.chunks.push(bytes);
    r.bytes += bytes.length;
    r.records += 1;
    if (!r.head) r.head = bytes.slice(0, 16);
    if (image) drawRaw(pid, bytes);
    else {
      const type = pictureType(bytes);
      if (type) addPicture(pid, r.records, type, bytes);
    }
    if (!rawRenderTimer) rawRenderTimer = setTimeout(renderRaw, 200);
  }
  ctx.onCleanup(() => clearTimeout(rawRenderTimer));

  function renderRaw() {
    rawRenderTimer = null;
    if (raw.size === 0) return;
    rawSection.hidden = false;
    const pids = [...raw.keys()].sort((a, b) => a - b);
    fill(rawBody,
      ...pids.map((pid) => {
        const r = raw.get(pid);
        const hex = [...(r.head || [])].map((b) => b.toString(16).padStart(2, '0')).join(' ');
        return h(
          'tr',
          {},
          h('th', { scope: 'row' }, String(pid)),
          h('td', { class: 'num' }, String(r.records)),
          h('td', { class: 'num nowrap' }, fmtBytes(r.bytes)),
          h('td', {}, h('code', {}, hex)),
          h('td', {}, h('button', { type: 'button', class: 'secondary small-btn', 'aria-label': `Download the raw data of pid ${pid}`, onclick: () => download(`job-${id}-pid-${pid}.bin`, r.chunks, 'application/octet-stream') }, 'Download')),
        );
      }),
    );
  }

  // --- events

  function onEvent(ev) {
    let e;
    try {
      e = JSON.parse(ev.data);
    } catch {
      return;
    }
    const eid = Number(e.id ?? ev.id);
    if (Number.isFinite(eid)) {
      // Ids are strictly increasing: anything at or below the last one is a repeat.
      if (eid <= lastId) return;
      lastId = eid;
    }
    const kind = e.kind || ev.event;
    const pid = e.pid ?? null;
    const at = e.at ?? Date.now();
    switch (kind) {
      case 'stdout':
      case 'stderr':
        queueLine({ id: eid, pid, kind, text: e.text ?? '', at });
        break;
      case 'status':
        queueLine({ id: eid, pid, kind, text: e.text ?? '', at });
        addTimeline(`e${eid}`, at, pid === null ? e.text : `pid ${pid}: ${e.text}`, 'status');
        break;
      case 'raw':
        if (!imageDecided) earlyRaw.push([pid, e.data]);
        else handleRaw(pid, e.data);
        break;
      case 'process_exited':
        procState.set(pid, `exited after superstep ${e.superstep}`);
        addTimeline(`e${eid}`, at, `pid ${pid} exited after superstep ${e.superstep}.`, 'exited');
        renderProgress();
        break;
      case 'process_rolled_back':
        if (e.from_start) {
          procState.set(pid, 're-running from the start');
          addTimeline(`e${eid}`, at, `pid ${pid} was lost with its peer and no checkpoint of it survived; it re-runs from the start.`, 'warn');
        } else {
          procState.set(pid, `rolled back to superstep ${e.superstep}`);
          addTimeline(`e${eid}`, at, `pid ${pid} was lost with its peer and rolled back to its checkpoint of superstep ${e.superstep}.`, 'warn');
        }
        renderProgress();
        break;
      case 'process_migrated': {
        const from = peersById.get(String(e.from))?.name ?? `peer ${e.from}`;
        const to = peersById.get(String(e.to))?.name ?? `peer ${e.to}`;
        procState.set(pid, `migrated to ${to}`);
        addTimeline(`e${eid}`, at, `pid ${pid} migrated from ${from} to ${to} after superstep ${e.superstep}.`, 'migrated');
        renderProgress();
        break;
      }
      case 'copies_disagree': {
        const names = (e.peers ?? []).map((p) => peersById.get(String(p))?.name ?? `peer ${p}`).join(' and ');
        procState.set(pid, `copies disagree at superstep ${e.superstep}; a third run decides`);
        addTimeline(`e${eid}`, at, `pid ${pid}: the copies on ${names} computed different results in superstep ${e.superstep} (${e.what}); a third run decides.`, 'warn');
        renderProgress();
        break;
      }
      case 'peer_quarantined': {
        const name = peersById.get(String(e.peer))?.name ?? `peer ${e.peer}`;
        addTimeline(`e${eid}`, at, `${name} was quarantined: ${e.reason}`, 'warn');
        break;
      }
      case 'job_exited':
        finish(eid, at, 'The job exited: every process returned normally.', 'ok');
        break;
      case 'job_aborted':
        finish(eid, at, `The job aborted: ${e.reason}`, 'bad');
        break;
      case 'job_failed':
        finish(eid, at, `The job died on an error: ${e.reason}`, 'bad');
        break;
      case 'job_killed':
        finish(eid, at, 'The job was killed.', 'bad');
        break;
      default:
        break;
    }
  }

  function finish(eid, at, text, cls) {
    done = true;
    // Only for a job this page saw running: opening a finished job's page is no news.
    if (announcedState !== null && !announcedState.startsWith('finished')) announce(text);
    queueLine({ id: eid, pid: null, kind: 'status', text, at });
    addTimeline(`e${eid}`, at, text, `terminal ${cls}`);
    streamStatus.textContent = 'Stream complete.';
    refreshJob();
  }

  function setStreamStatus(st, err) {
    if (done) {
      streamStatus.textContent = 'Stream complete.';
      return;
    }
    streamStatus.textContent = {
      connecting: 'Connecting…',
      live: 'Streaming live.',
      retrying: `Connection lost${err ? ` (${err.message})` : ''}; reconnecting…`,
      unsupported: 'This job has no event stream.',
      ended: 'Stream ended.',
    }[st] ?? st;
  }

  // --- loading

  async function loadJob() {
    try {
      job = await api('GET', `/jobs/${id}`, { signal: ctx.signal });
    } catch (e) {
      if (e.status === 404) {
        stateLine.textContent = '';
        const gone = new Error(`There is no job ${id} among your jobs (it may have been deleted).`);
        gone.stopPolling = true;
        throw gone;
      }
      throw e;
    }
    renderHead();
    timelineFromJob();
    return !(job.state === 'finished' && done); // once both, nothing more will change
  }
  const refreshJob = ctx.poll(JOB_POLL_MS, loadJob, 'job');

  // Peer names for the progress table and migrations (best effort).
  api('GET', '/peers', { signal: ctx.signal })
    .then((ps) => {
      peersById = new Map(ps.map((p) => [String(p.id), p]));
      renderProgress();
    })
    .catch(() => {});

  (async () => {
    // Decide whether raw output is an image before the stream starts.
    const first = await api('GET', `/jobs/${id}`, { signal: ctx.signal }).catch(() => null);
    if (ctx.signal.aborted || !first) return;
    job = job ?? first;
    if (await isMandelbrot(first, ctx.signal)) {
      job = job ?? first;
      image = setupImage();
    }
    imageDecided = true;
    for (const [pid, data] of earlyRaw) handleRaw(pid, data);
    earlyRaw = [];
    rerenderLog();
    await followSse(`/jobs/${id}/events`, {
      signal: ctx.signal,
      lastId: null,
      onEvent,
      onStatus: setStreamStatus,
      onClosed: async () => {
        if (done) return false;
        // The server ends a stream after the job's last event, or when the
        // job is gone; a stream cut short (a proxy, a restart) ends early.
        // Reconnect (with Last-Event-ID) while the job runs, or while a
        // finished job's stream still brings news: its last event is due.
        if (lastId > lastIdAtClose) closesWithoutNews = 0;
        lastIdAtClose = lastId;
        closesWithoutNews++;
        try {
          const j = await api('GET', `/jobs/${id}`, { signal: ctx.signal });
          job = j;
          renderHead();
          return j.state !== 'finished' || closesWithoutNews < 3;
        } catch {
          return false;
        }
      },
    });
    if (!ctx.signal.aborted) {
      flushLines();
      if (lines.length === 0) rerenderLog();
    }
  })().catch((e) => showError(e));

}

// --------------------------------------------------------------------- submit

function submitPage(main, ctx, params) {
  const formError = h('p', { class: 'form-error', role: 'alert', id: 'submit-error', hidden: true });
  const programSel = h('select', { id: 'submit-program', name: 'program', required: true, 'aria-describedby': 'program-help' }, h('option', { value: '' }, 'Loading programs…'));
  const programHelp = h('p', { id: 'program-help', class: 'help' });
  const nprocs = h('input', { id: 'submit-nprocs', name: 'nprocs', type: 'number', inputmode: 'numeric', min: 1, max: MAX_NPROCS, step: 1, value: params.get('nprocs') || '4', required: true, 'aria-describedby': 'nprocs-help nprocs-error' });
  const nprocsError = h('p', { id: 'nprocs-error', class: 'field-error', hidden: true });
  const args = h('textarea', { id: 'submit-args', name: 'args', rows: 5, spellcheck: 'false', autocapitalize: 'none', placeholder: '{"n": 1000000}', 'aria-describedby': 'args-help args-error' });
  args.value = params.get('args') || '';
  const argsError = h('p', { id: 'args-error', class: 'field-error', 'aria-live': 'polite' });
  const description = h('input', { id: 'submit-description', name: 'description', maxlength: 4096, value: params.get('description') || '' });
  const seed = h('input', { id: 'submit-seed', name: 'seed', inputmode: 'numeric', 'aria-describedby': 'seed-help', placeholder: 'random' });
  const minPeers = h('input', { id: 'submit-min-peers', name: 'min_peers', type: 'number', min: 1, step: 1, 'aria-describedby': 'min-peers-help', placeholder: 'queue whatever happens' });
  const redundancy = h('input', { id: 'submit-redundancy', name: 'redundancy', type: 'checkbox', 'aria-describedby': 'redundancy-help' });
  const button = h('button', { type: 'submit', id: 'submit-button' }, 'Submit job');

  function parseArgs() {
    const text = args.value.trim();
    if (text === '') return { ok: true, value: null };
    try {
      return { ok: true, value: JSON.parse(text) };
    } catch (e) {
      return { ok: false, message: `The arguments are not valid JSON: ${e.message}. Example: {"n": 1000000}, or leave the box empty for none.` };
    }
  }
  function checkArgs() {
    const r = parseArgs();
    args.setAttribute('aria-invalid', r.ok ? 'false' : 'true');
    argsError.textContent = r.ok ? '' : r.message;
    argsError.hidden = r.ok;
    return r;
  }
  function checkNprocs() {
    const n = Number(nprocs.value);
    const ok = Number.isInteger(n) && n >= 1 && n <= MAX_NPROCS;
    nprocs.setAttribute('aria-invalid', ok ? 'false' : 'true');
    nprocsError.textContent = ok ? '' : `The number of processes must be a whole number from 1 to ${MAX_NPROCS}.`;
    nprocsError.hidden = ok;
    return ok ? n : null;
  }
  args.addEventListener('input', checkArgs);
  nprocs.addEventListener('input', checkNprocs);

  let programs = [];
  function describeProgram() {
    const p = programs.find((x) => (x.name ?? x.hash) === programSel.value);
    programHelp.textContent = p ? `${p.description || 'No description.'} (${fmtBytes(p.size)}, ${shortHash(p.hash)})` : '';
  }
  programSel.addEventListener('change', describeProgram);

  const form = h(
    'form',
    { class: 'card', id: 'submit-form', novalidate: true },
    h('div', { class: 'field' }, h('label', { for: 'submit-program' }, 'Program'), programSel, programHelp),
    h('div', { class: 'field' }, h('label', { for: 'submit-nprocs' }, 'Number of processes'), nprocs, h('p', { id: 'nprocs-help', class: 'help' }, `1 to ${MAX_NPROCS}. A fast peer may run several.`), nprocsError),
    h('div', { class: 'field' }, h('label', { for: 'submit-args' }, 'Arguments (JSON)'), args, h('p', { id: 'args-help', class: 'help' }, 'Handed to the program’s main. Leave empty for none.'), argsError),
    h('div', { class: 'field' }, h('label', { for: 'submit-description' }, 'Description ', h('span', { class: 'muted' }, '(optional)')), description),
    h(
      'details',
      { class: 'advanced' },
      h('summary', {}, 'Advanced'),
      h('div', { class: 'field' }, h('label', { for: 'submit-seed' }, 'Seed'), seed, h('p', { id: 'seed-help', class: 'help' }, 'Seed of the processes’ random number generators; the same seed gives the same run.')),
      h('div', { class: 'field' }, h('label', { for: 'submit-min-peers' }, 'Minimum peers online'), minPeers, h('p', { id: 'min-peers-help', class: 'help' }, 'Refuse the job instead of queueing it when fewer peers are online.')),
      h('div', { class: 'field' }, h('label', { for: 'submit-redundancy' }, redundancy, ' Validate results (run every process twice)'), h('p', { id: 'redundancy-help', class: 'help' }, 'Each process runs on two peers of different volunteers, and nothing counts until both computed the same; a peer that computes wrongly is outvoted by a third run and shut out. Costs twice the computing.')),
    ),
    formError,
    h('div', { class: 'actions' }, button),
  );
  argsError.hidden = true;

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    formError.hidden = true;
    if (!programSel.value) {
      formError.textContent = 'Choose a program to run.';
      formError.hidden = false;
      programSel.focus();
      return;
    }
    const n = checkNprocs();
    if (n === null) {
      nprocs.focus();
      return;
    }
    const a = checkArgs();
    if (!a.ok) {
      args.focus();
      return;
    }
    const body = { program: programSel.value, nprocs: n, args: a.value };
    if (description.value.trim()) body.description = description.value.trim();
    if (seed.value.trim()) {
      const v = Number(seed.value.trim());
      if (!/^\d+$/.test(seed.value.trim()) || !Number.isSafeInteger(v)) {
        formError.textContent = `The seed must be a whole number from 0 to ${Number.MAX_SAFE_INTEGER}.`;
        formError.hidden = false;
        seed.focus();
        return;
      }
      body.seed = v;
    }
    if (minPeers.value.trim()) {
      const v = Number(minPeers.value);
      if (!Number.isInteger(v) || v < 1) {
        formError.textContent = 'The minimum number of peers must be a whole number, at least 1.';
        formError.hidden = false;
        minPeers.focus();
        return;
      }
      body.min_peers = v;
    }
    if (redundancy.checked) body.limits = { ...DEFAULT_LIMITS, redundancy: 2 };
    button.disabled = true;
    button.textContent = 'Submitting…';
    try {
      const job = await api('POST', '/jobs', { json: body, signal: ctx.signal });
      notify(`Job ${job.id} submitted.`);
      clearError();
      go(`#/jobs/${job.id}`);
    } catch (err) {
      if (err.name === 'AbortError' || err.code === 'unauthorized_handled') return;
      formError.textContent = `The job was not accepted: ${err.message}`;
      formError.hidden = false;
      formError.focus?.();
    } finally {
      button.disabled = false;
      button.textContent = 'Submit job';
    }
  });

  main.append(h('h1', {}, 'Submit a job'), form);

  (async () => {
    programsCache = null;
    programs = await programsList(ctx.signal);
    const mine = programs.filter((p) => !p.builtin);
    const builtin = programs.filter((p) => p.builtin);
    const opt = (p) => h('option', { value: p.name ?? p.hash }, p.name ? `${p.name}${p.builtin ? '' : ` (${shortHash(p.hash)})`}` : `unnamed ${shortHash(p.hash)}`);
    fill(programSel,
      h('option', { value: '' }, 'Choose a program…'),
      mine.length ? h('optgroup', { label: 'Your programs' }, mine.map(opt)) : null,
      builtin.length ? h('optgroup', { label: 'Examples' }, builtin.map(opt)) : null,
    );
    const want = params.get('program');
    if (want && [...programSel.options].some((o) => o.value === want)) programSel.value = want;
    else if (want) {
      programSel.append(h('option', { value: want }, want));
      programSel.value = want;
    }
    describeProgram();
  })().catch((e) => {
    fill(programSel, h('option', { value: '' }, 'Cannot load programs'));
    showError(e);
  });
}

// ------------------------------------------------------------------- programs

function programsPage(main, ctx) {
  const fileInput = h('input', { id: 'upload-file', name: 'file', type: 'file', accept: '.wasm,application/wasm', required: true, 'aria-describedby': 'upload-file-help' });
  const nameInput = h('input', { id: 'upload-name', name: 'name', maxlength: 64, autocapitalize: 'none', spellcheck: 'false', pattern: '[A-Za-z0-9_.\\-]{1,64}', 'aria-describedby': 'upload-name-help' });
  const descInput = h('input', { id: 'upload-description', name: 'description', maxlength: 4096 });
  const uploadError = h('p', { id: 'upload-error', class: 'form-error', role: 'alert', hidden: true, tabindex: -1 });
  const button = h('button', { type: 'submit', id: 'upload-button' }, 'Upload');
  const tbody = h('tbody');
  const empty = h('p', { class: 'muted', hidden: true }, 'No programs yet.');

  fileInput.addEventListener('change', () => {
    const f = fileInput.files?.[0];
    if (f && !nameInput.value) nameInput.value = f.name.replace(/\.wasm$/i, '').replace(/[^A-Za-z0-9_.-]/g, '-').slice(0, 64);
  });

  const form = h(
    'form',
    { class: 'card', id: 'upload-form', novalidate: true, 'aria-labelledby': 'upload-heading' },
    h('h2', { id: 'upload-heading' }, 'Upload a program'),
    h('div', { class: 'field' }, h('label', { for: 'upload-file' }, 'WebAssembly module (.wasm)'), fileInput, h('p', { id: 'upload-file-help', class: 'help' }, 'Built for wasm32-unknown-unknown against the bspweb guest SDK. The supernode checks it before storing it.')),
    h('div', { class: 'field' }, h('label', { for: 'upload-name' }, 'Name'), nameInput, h('p', { id: 'upload-name-help', class: 'help' }, '1 to 64 letters, digits, _, . and -. You submit jobs by this name.')),
    h('div', { class: 'field' }, h('label', { for: 'upload-description' }, 'Description ', h('span', { class: 'muted' }, '(optional)')), descInput),
    uploadError,
    h('div', { class: 'actions' }, button),
  );

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    uploadError.hidden = true;
    const fail = (msg, focus) => {
      uploadError.textContent = msg;
      uploadError.hidden = false;
      (focus || uploadError).focus();
    };
    const file = fileInput.files?.[0];
    if (!file) return fail('Choose a .wasm file to upload.', fileInput);
    if (file.size === 0) return fail(`${file.name} is empty.`, fileInput);
    if (file.size > MAX_UPLOAD_BYTES) return fail(`${file.name} is ${fmtBytes(file.size)}; the supernode accepts modules up to ${fmtBytes(MAX_UPLOAD_BYTES)}.`, fileInput);
    const name = nameInput.value.trim();
    if (name && !PROGRAM_NAME_RE.test(name)) return fail(`“${name}” is not a valid program name: use 1 to 64 letters, digits, _, . and -.`, nameInput);
    const q = new URLSearchParams();
    if (name) q.set('name', name);
    if (descInput.value.trim()) q.set('description', descInput.value.trim());
    button.disabled = true;
    button.textContent = 'Uploading…';
    try {
      const bytes = await file.arrayBuffer();
      const info = await api('POST', `/programs?${q}`, { body: bytes, contentType: 'application/wasm', signal: ctx.signal });
      notify(`Uploaded ${info.name ?? shortHash(info.hash)} (${fmtBytes(info.size)}).`);
      form.reset();
      programsCache = null;
      await load();
    } catch (err) {
      if (err.name === 'AbortError' || err.code === 'unauthorized_handled') return;
      fail(`The upload was refused: ${err.message}`);
    } finally {
      button.disabled = false;
      button.textContent = 'Upload';
    }
  });

  async function remove(p) {
    const ref = p.name ?? p.hash;
    if (!confirm(`Delete the program ${ref}? Jobs that already ran keep their output.`)) return;
    try {
      await api('DELETE', `/programs/${encodeURIComponent(ref)}`, { signal: ctx.signal });
      notify(`Deleted the program ${ref}.`);
      clearError();
      programsCache = null;
      await load();
    } catch (e) {
      showError(e);
    }
  }

  function row(p) {
    const ref = p.name ?? p.hash;
    return h(
      'tr',
      { dataset: { program: ref } },
      h('th', { scope: 'row' }, p.name ?? h('span', { class: 'muted' }, 'unnamed')),
      h('td', { class: 'nowrap' }, h('code', { title: p.hash }, shortHash(p.hash))),
      h('td', { class: 'num nowrap' }, fmtBytes(p.size)),
      h('td', {}, p.builtin ? h('span', { class: 'badge builtin' }, 'builtin') : 'yours'),
      h('td', { class: 'desc-cell' }, p.description || ''),
      h(
        'td',
        {},
        h(
          'div',
          { class: 'row-actions' },
          h('a', { class: 'button small-btn', href: `#/submit?program=${encodeURIComponent(ref)}`, 'aria-label': `Run ${ref}` }, 'Run'),
          p.builtin ? null : h('button', { type: 'button', class: 'danger small-btn', 'aria-label': `Delete ${ref}`, onclick: () => remove(p) }, 'Delete'),
        ),
      ),
    );
  }

  async function load() {
    const list = await api('GET', '/programs', { signal: ctx.signal });
    list.sort((a, b) => Number(a.builtin) - Number(b.builtin) || String(a.name ?? '~').localeCompare(String(b.name ?? '~')));
    fill(tbody, ...list.map(row));
    empty.hidden = list.length > 0;
  }

  main.append(
    h('h1', {}, 'Programs'),
    form,
    h(
      'section',
      { 'aria-labelledby': 'programs-heading' },
      h('h2', { id: 'programs-heading' }, 'Your programs and the examples'),
      empty,
      scrollTable(
        'Programs',
        h('table', { id: 'programs' }, h('thead', {}, h('tr', {}, ['Name', 'Hash', 'Size', 'Kind', 'Description', 'Actions'].map((t) => colHead(t)))), tbody),
      ),
    ),
  );
  load().catch(showError);
}

// ------------------------------------------------------------------ accounts

const ROLES = [
  ['user', 'User', 'uploads programs and runs jobs'],
  ['volunteer', 'Volunteer', 'donates computers, runs no jobs'],
  ['admin', 'Administrator', 'runs jobs and manages accounts'],
];
const USER_NAME_RE = /^[A-Za-z0-9_.-]{1,64}$/;

/** "used / limit", with "no limit" for a quota of 0. */
function quotaText(used, max) {
  return max ? `${used} of ${max}` : `${used} (no limit)`;
}

/** A labelled field; `help` becomes its description. */
function field(id, label, input, help) {
  const helpId = help ? `${id}-help` : null;
  if (helpId) input.setAttribute('aria-describedby', helpId);
  return h('div', { class: 'field' }, h('label', { for: id }, label), input, help ? h('p', { id: helpId, class: 'help' }, help) : null);
}

function accountPage(main, ctx) {
  const facts = h('dl', { class: 'facts', id: 'account-facts' });
  const current = h('input', { id: 'pw-current', type: 'password', autocomplete: 'current-password', required: true });
  const next = h('input', { id: 'pw-new', type: 'password', autocomplete: 'new-password', required: true, minlength: 8, maxlength: 1024 });
  const again = h('input', { id: 'pw-again', type: 'password', autocomplete: 'new-password', required: true });
  const err = h('p', { id: 'pw-error', class: 'form-error', role: 'alert', hidden: true, tabindex: -1 });
  const button = h('button', { type: 'submit', id: 'pw-button' }, 'Change password');
  const form = h(
    'form',
    { class: 'card narrow', id: 'password-form', novalidate: true, 'aria-labelledby': 'pw-heading' },
    h('h2', { id: 'pw-heading' }, 'Change your password'),
    field('pw-current', 'Current password', current),
    field('pw-new', 'New password', next, '8 to 1024 characters. Your other sign-ins (other browsers, the CLI) end.'),
    field('pw-again', 'New password again', again),
    err,
    h('div', { class: 'actions' }, button),
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    err.hidden = true;
    const fail = (msg, focus) => {
      err.textContent = msg;
      err.hidden = false;
      (focus || err).focus();
    };
    if (!current.value) return fail('Enter your current password.', current);
    if (next.value.length < 8 || next.value.length > 1024) return fail('The new password must be 8 to 1024 characters long.', next);
    if (next.value !== again.value) return fail('The two new passwords differ.', again);
    button.disabled = true;
    try {
      const res = await api('POST', '/me/password', { json: { current_password: current.value, new_password: next.value }, signal: ctx.signal });
      saveSession({ token: res.token, expires_at: res.expires_at, user: res.user });
      form.reset();
      notify('Password changed. Your other sign-ins have ended.');
    } catch (e2) {
      if (e2.name === 'AbortError' || e2.code === 'unauthorized_handled') return;
      fail(e2.code === 'wrong_password' ? 'The current password is wrong; nothing was changed.' : `The password was not changed: ${e2.message}`, e2.code === 'wrong_password' ? current : null);
    } finally {
      button.disabled = false;
    }
  });

  async function load() {
    const me = await api('GET', '/me', { signal: ctx.signal });
    const u = me.usage ?? { processes: 0, programs: 0, output_bytes: 0 };
    const q = me.quotas ?? {};
    const row = (k, v) => [h('dt', {}, k), h('dd', {}, v)];
    fill(
      facts,
      ...row('Name', me.name),
      ...row('Role', ROLES.find(([r]) => r === me.role)?.[1] ?? me.role),
      ...row('Processes running', quotaText(u.processes, q.max_processes)),
      ...row('Programs stored', quotaText(u.programs, q.max_programs)),
      ...row('Output stored', q.max_output_mib ? `${fmtBytes(u.output_bytes)} of ${q.max_output_mib} MiB` : `${fmtBytes(u.output_bytes)} (no limit)`),
    );
  }

  main.append(
    h('h1', {}, 'Your account'),
    h('section', { 'aria-labelledby': 'facts-heading', class: 'card narrow' }, h('h2', { id: 'facts-heading' }, 'Role and quotas'), facts),
    form,
  );
  load().catch(showError);
}

function usersPage(main, ctx) {
  const tbody = h('tbody');
  const isMe = (u) => u.name === session?.user?.name;

  // Create an account.
  const name = h('input', { id: 'new-user-name', required: true, maxlength: 64, autocapitalize: 'none', spellcheck: 'false' });
  const password = h('input', { id: 'new-user-password', type: 'password', autocomplete: 'new-password', required: true });
  const role = h('select', { id: 'new-user-role' }, ROLES.map(([v, t, d]) => h('option', { value: v }, `${t} — ${d}`)));
  const createErr = h('p', { id: 'new-user-error', class: 'form-error', role: 'alert', hidden: true, tabindex: -1 });
  const createButton = h('button', { type: 'submit', id: 'new-user-button' }, 'Create account');
  const createForm = h(
    'form',
    { class: 'card', id: 'new-user-form', novalidate: true, 'aria-labelledby': 'new-user-heading' },
    h('h2', { id: 'new-user-heading' }, 'Create an account'),
    field('new-user-name', 'Name', name, '1 to 64 letters, digits, _, . and -.'),
    field('new-user-password', 'Password', password, '8 to 1024 characters; they can change it on their Account page.'),
    field('new-user-role', 'Role', role),
    createErr,
    h('div', { class: 'actions' }, createButton),
  );
  createForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    createErr.hidden = true;
    const fail = (msg, focus) => {
      createErr.textContent = msg;
      createErr.hidden = false;
      (focus || createErr).focus();
    };
    if (!USER_NAME_RE.test(name.value.trim())) return fail('Use 1 to 64 letters, digits, _, . and - for the name.', name);
    if (password.value.length < 8) return fail('The password must be at least 8 characters long.', password);
    createButton.disabled = true;
    try {
      const u = await api('POST', '/users', { json: { name: name.value.trim(), password: password.value, role: role.value }, signal: ctx.signal });
      notify(`Created the account ${u.name}.`);
      createForm.reset();
      await load();
    } catch (e2) {
      if (e2.name === 'AbortError' || e2.code === 'unauthorized_handled') return;
      fail(`The account was not created: ${e2.message}`);
    } finally {
      createButton.disabled = false;
    }
  });

  // Edit one account: role, quotas, password.
  const editSection = h('section', { class: 'card', id: 'edit-user', hidden: true, 'aria-labelledby': 'edit-user-heading' });

  function editForm(u) {
    const id = (k) => `edit-${k}`;
    const roleSel = h('select', { id: id('role'), disabled: isMe(u) }, ROLES.map(([v, t]) => h('option', { value: v, selected: v === u.role }, t)));
    const num = (k, v) => h('input', { id: id(k), type: 'number', min: 0, step: 1, value: String(v ?? 0), inputmode: 'numeric' });
    const procs = num('max-processes', u.quotas?.max_processes);
    const progs = num('max-programs', u.quotas?.max_programs);
    const out = num('max-output-mib', u.quotas?.max_output_mib);
    const err = h('p', { id: 'edit-error', class: 'form-error', role: 'alert', hidden: true, tabindex: -1 });
    const save = h('button', { type: 'submit', id: 'edit-save' }, 'Save');
    const pw = h('input', { id: id('password'), type: 'password', autocomplete: 'new-password' });
    const pwButton = h('button', { type: 'button', id: 'edit-set-password', class: 'secondary' }, 'Set password');
    const fail = (msg, focus) => {
      err.textContent = msg;
      err.hidden = false;
      (focus || err).focus();
    };
    const form = h(
      'form',
      { novalidate: true },
      field(id('role'), 'Role', roleSel, isMe(u) ? 'You cannot change your own role; another administrator can.' : null),
      field(id('max-processes'), 'Processes at once', procs, '0: no limit. A job that would go beyond waits.'),
      field(id('max-programs'), 'Programs stored', progs, '0: no limit.'),
      field(id('max-output-mib'), 'Output stored (MiB)', out, '0: no limit. A job that would go beyond fails.'),
      err,
      h('div', { class: 'actions' }, save, h('button', { type: 'button', class: 'secondary', onclick: () => (editSection.hidden = true) }, 'Close')),
      h('h3', {}, 'Password'),
      field(id('password'), 'New password', pw, 'Their sign-ins end; tell them the new password.'),
      h('div', { class: 'actions' }, pwButton),
    );
    const whole = (input, label) => {
      const v = Number(input.value);
      if (!Number.isInteger(v) || v < 0) {
        fail(`${label} must be a whole number, 0 or more.`, input);
        return null;
      }
      return v;
    };
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      err.hidden = true;
      const quotas = {
        max_processes: whole(procs, 'Processes at once'),
        max_programs: whole(progs, 'Programs stored'),
        max_output_mib: whole(out, 'Output stored'),
      };
      if (Object.values(quotas).some((v) => v === null)) return;
      const change = { quotas };
      if (!isMe(u)) change.role = roleSel.value;
      save.disabled = true;
      try {
        await api('PATCH', `/users/${encodeURIComponent(u.name)}`, { json: change, signal: ctx.signal });
        notify(`Saved ${u.name}.`);
        await load();
      } catch (e2) {
        if (e2.name === 'AbortError' || e2.code === 'unauthorized_handled') return;
        fail(`Not saved: ${e2.message}`);
      } finally {
        save.disabled = false;
      }
    });
    pwButton.addEventListener('click', async () => {
      err.hidden = true;
      if (pw.value.length < 8) return fail('The password must be at least 8 characters long.', pw);
      pwButton.disabled = true;
      try {
        await api('POST', `/users/${encodeURIComponent(u.name)}/password`, { json: { password: pw.value }, signal: ctx.signal });
        pw.value = '';
        notify(`Set the password of ${u.name}; their sign-ins have ended.`);
      } catch (e2) {
        if (e2.name === 'AbortError' || e2.code === 'unauthorized_handled') return;
        fail(`The password was not set: ${e2.message}`);
      } finally {
        pwButton.disabled = false;
      }
    });
    fill(editSection, h('h2', { id: 'edit-user-heading' }, `Edit ${u.name}`), form);
    editSection.hidden = false;
    roleSel.disabled ? procs.focus() : roleSel.focus();
  }

  async function setDisabled(u, disabled) {
    if (disabled && !confirm(`Disable ${u.name}? They are signed out at once and cannot sign in; their running jobs go on.`)) return;
    try {
      await api('PATCH', `/users/${encodeURIComponent(u.name)}`, { json: { disabled }, signal: ctx.signal });
      notify(`${disabled ? 'Disabled' : 'Enabled'} ${u.name}.`);
      clearError();
      await load();
    } catch (e) {
      showError(e);
    }
  }

  function row(u) {
    const usage = u.usage ?? {};
    const q = u.quotas ?? {};
    return h(
      'tr',
      { dataset: { user: u.name } },
      h('th', { scope: 'row' }, u.name, isMe(u) ? h('span', { class: 'muted' }, ' (you)') : null),
      h('td', {}, ROLES.find(([r]) => r === u.role)?.[1] ?? u.role),
      h('td', {}, u.disabled ? h('span', { class: 'badge failed' }, 'disabled') : 'enabled'),
      h('td', { class: 'num nowrap' }, quotaText(usage.processes ?? 0, q.max_processes)),
      h('td', { class: 'num nowrap' }, quotaText(usage.programs ?? 0, q.max_programs)),
      h('td', { class: 'num nowrap' }, q.max_output_mib ? `${fmtBytes(usage.output_bytes ?? 0)} of ${q.max_output_mib} MiB` : fmtBytes(usage.output_bytes ?? 0)),
      h(
        'td',
        {},
        h(
          'div',
          { class: 'row-actions' },
          h('button', { type: 'button', class: 'secondary small-btn', 'aria-label': `Edit ${u.name}`, onclick: () => editForm(u) }, 'Edit'),
          isMe(u)
            ? null
            : u.disabled
              ? h('button', { type: 'button', class: 'small-btn', 'aria-label': `Enable ${u.name}`, onclick: () => setDisabled(u, false) }, 'Enable')
              : h('button', { type: 'button', class: 'danger small-btn', 'aria-label': `Disable ${u.name}`, onclick: () => setDisabled(u, true) }, 'Disable'),
        ),
      ),
    );
  }

  async function load() {
    const users = await api('GET', '/users', { signal: ctx.signal });
    fill(tbody, ...users.map(row));
  }

  main.append(
    h('h1', {}, 'Users'),
    h(
      'section',
      { 'aria-labelledby': 'users-heading' },
      h('h2', { id: 'users-heading' }, 'Accounts'),
      scrollTable('Accounts', h('table', { id: 'users' }, h('thead', {}, h('tr', {}, ['Name', 'Role', 'State', 'Processes', 'Programs', 'Output', 'Actions'].map((t) => colHead(t)))), tbody)),
    ),
    editSection,
    createForm,
  );
  load().catch(showError);
}

// ---------------------------------------------------------------------- peers

/** A distinct colour per index (golden-angle hues). */
const peerColor = (i) => `hsl(${(i * 137.508) % 360} 65% 48%)`;

/** The arcs each peer wins: sampled lower envelope of ((x − p) mod 1) / w. */
function ringArcs(peers, samples = 1440) {
  const arcs = [];
  if (!peers.length) return arcs;
  let cur = null;
  for (let k = 0; k < samples; k++) {
    const x = (k + 0.5) / samples;
    let best = -1;
    let bestV = Infinity;
    peers.forEach((p, i) => {
      if (!(p.weight > 0)) return;
      const d = (((x - p.position) % 1) + 1) % 1;
      const v = d / p.weight;
      if (v < bestV) {
        bestV = v;
        best = i;
      }
    });
    if (cur && cur.peer === best) cur.end = (k + 1) / samples;
    else {
      cur = { peer: best, start: k / samples, end: (k + 1) / samples };
      arcs.push(cur);
    }
  }
  return arcs.filter((a) => a.peer >= 0);
}

function ringPoint(pos, r) {
  const a = 2 * Math.PI * pos - Math.PI / 2; // 0 at the top, clockwise
  return [r * Math.cos(a), r * Math.sin(a)];
}

function arcPath(start, end, r) {
  const [x0, y0] = ringPoint(start, r);
  const [x1, y1] = ringPoint(end, r);
  const large = end - start > 0.5 ? 1 : 0;
  return `M ${x0.toFixed(4)} ${y0.toFixed(4)} A ${r} ${r} 0 ${large} 1 ${x1.toFixed(4)} ${y1.toFixed(4)}`;
}

function ringSvg(ring) {
  const peers = ring.peers || [];
  const procs = ring.processes || [];
  const index = new Map(peers.map((p, i) => [String(p.id), i]));
  const titleId = uid('ring-title');
  const descId = uid('ring-desc');
  const svg = s('svg', { viewBox: '-1.75 -1.4 3.5 2.8', class: 'ring', id: 'ring-svg', role: 'img', 'aria-labelledby': `${titleId} ${descId}` });
  svg.append(
    s('title', { id: titleId }, 'The DHHT ring'),
    s('desc', { id: descId }, `${peers.length} peer${peers.length === 1 ? '' : 's'} on the unit ring, coloured arcs showing the part of the ring each wins, and ${procs.length} running process${procs.length === 1 ? '' : 'es'} at their positions. The table next to it lists the same.`),
    s('circle', { cx: 0, cy: 0, r: 1, class: 'ring-base' }),
  );
  for (const a of ringArcs(peers)) {
    const p = peers[a.peer];
    svg.append(s('path', { d: arcPath(a.start, a.end, 1), class: 'ring-arc', stroke: peerColor(a.peer), dataset: { peer: p.id } }, s('title', {}, `${p.name} wins ${a.start.toFixed(3)}–${a.end.toFixed(3)}`)));
  }
  // 0 mark
  svg.append(s('line', { x1: 0, y1: -0.9, x2: 0, y2: -1.1, class: 'ring-zero' }), s('text', { x: 0, y: -1.16, class: 'ring-zero-label', 'text-anchor': 'middle' }, '0'));
  // processes inside the ring, stacked inward when several share a place
  const stack = new Map();
  for (const pr of procs) {
    const i = index.get(String(pr.peer));
    const bucket = Math.round(pr.position * 180);
    const depth = stack.get(bucket) ?? 0;
    stack.set(bucket, depth + 1);
    const [x, y] = ringPoint(pr.position, 0.86 - Math.min(depth, 8) * 0.07);
    svg.append(
      s(
        'circle',
        { cx: x.toFixed(4), cy: y.toFixed(4), r: 0.028, class: 'ring-proc', fill: i === undefined ? 'currentColor' : peerColor(i), dataset: { job: pr.job, pid: pr.pid } },
        s('title', {}, `job ${pr.job} pid ${pr.pid} at ${pr.position.toFixed(4)} → ${i === undefined ? `peer ${pr.peer}` : peers[i].name}`),
      ),
    );
  }
  // peers on the ring with labels outside
  peers.forEach((p, i) => {
    const [x, y] = ringPoint(p.position, 1);
    const [lx, ly] = ringPoint(p.position, 1.14);
    svg.append(
      s('circle', { cx: x.toFixed(4), cy: y.toFixed(4), r: 0.06, class: 'ring-peer', fill: peerColor(i), dataset: { peer: p.id } }, s('title', {}, `${p.name}: position ${p.position.toFixed(4)}, weight ${p.weight.toFixed(2)}, share ${pct(p.share)}`)),
      s('text', { x: lx.toFixed(4), y: ly.toFixed(4), class: 'ring-label', 'text-anchor': lx > 0.05 ? 'start' : lx < -0.05 ? 'end' : 'middle', 'dominant-baseline': 'middle' }, p.name.length > 12 ? `${p.name.slice(0, 11)}…` : p.name),
    );
  });
  return svg;
}

function peersPage(main, ctx) {
  const tbody = h('tbody');
  const empty = h('p', { class: 'muted', hidden: true }, 'No peers have joined yet.');
  const ringBox = h('div', { class: 'ring-box', id: 'ring' });
  const ringLegend = h('tbody');
  const ringNote = h('p', { class: 'muted small', id: 'ring-note' });
  const procTable = h('tbody');
  const procDetails = h(
    'details',
    { class: 'ring-processes' },
    h('summary', {}, 'Processes on the ring'),
    scrollTable('Processes on the ring', h('table', {}, h('thead', {}, h('tr', {}, ['Job', 'Pid', 'Position', 'Peer'].map((t) => colHead(t)))), procTable)),
  );
  let ringSupported = true;
  let peerCache = [];
  const me = session?.user ?? {};
  const isAdmin = me.role === 'admin' || me.admin;
  const canChange = (p) => isAdmin || (p.owner && p.owner === me.name);

  // Enrollment tokens: peers log in with one, and are its account's.
  const tokenBody = h('tbody');
  const tokenEmpty = h('p', { class: 'muted', hidden: true }, 'No enrollment tokens yet.');
  const tokenName = h('input', { id: 'token-name', name: 'name', required: true, maxlength: 64, placeholder: 'e.g. lab machines', 'aria-describedby': 'token-help' });
  const tokenErr = h('p', { id: 'token-error', class: 'form-error', role: 'alert', hidden: true, tabindex: -1 });
  const tokenShown = h('div', { id: 'token-new', class: 'token-new', hidden: true });
  const tokenForm = h(
    'form',
    { id: 'token-form', class: 'inline-form' },
    h('div', { class: 'field' }, h('label', { for: 'token-name' }, 'Name'), tokenName,
      h('p', { id: 'token-help', class: 'help' }, 'A peer started with the token is yours. The token is shown once; the supernode keeps only its hash.')),
    h('button', { type: 'submit' }, 'Create token'),
    tokenErr,
  );
  tokenForm.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    tokenErr.hidden = true;
    try {
      const made = await api('POST', '/enrollments', { json: { name: tokenName.value.trim() }, signal: ctx.signal });
      const base = location.origin;
      fill(tokenShown,
        h('p', {}, `Token #${made.enrollment.id} “${made.enrollment.name}” — copy it now, it is not shown again:`),
        h('pre', { class: 'token-secret' }, h('code', { id: 'token-secret' }, made.token)),
        h('p', { class: 'small muted' }, 'Save it in a file only you can read, then start a peer with it:'),
        h('pre', {}, h('code', {}, `bspweb peer --supernode ${base} --token-file FILE\n# or as a service:\nbspweb peer install --supernode ${base} --token-file FILE`)),
      );
      tokenShown.hidden = false;
      tokenName.value = '';
      notify(`Created enrollment token #${made.enrollment.id}.`);
      await loadTokens();
    } catch (e) {
      tokenErr.textContent = e.message;
      tokenErr.hidden = false;
      tokenErr.focus();
    }
  });

  async function revokeToken(t) {
    if (!confirm(`Revoke enrollment token #${t.id} (${t.name})? Its ${t.peers_online} online peer(s) stop at once and their processes move elsewhere.`)) return;
    try {
      await api('DELETE', `/enrollments/${t.id}`, { signal: ctx.signal });
      notify(`Revoked enrollment token #${t.id}.`);
      await Promise.all([loadTokens(), loadPeers()]);
    } catch (e) {
      showError(e);
    }
  }

  async function setPeerDisabled(p, disabled) {
    if (disabled && !confirm(`Disable peer ${p.name}? It stops at once, its processes move elsewhere, and it cannot log in again until you enable it.`)) return;
    try {
      await api('PATCH', `/peers/${p.id}`, { json: { disabled }, signal: ctx.signal });
      notify(`${disabled ? 'Disabled' : 'Enabled'} peer ${p.name}.`);
      await Promise.all([loadTokens(), loadPeers()]);
    } catch (e) {
      showError(e);
    }
  }

  async function loadTokens() {
    const tokens = await api('GET', '/enrollments', { signal: ctx.signal });
    fill(tokenBody, ...tokens.map((t) => h(
      'tr',
      { dataset: { token: t.id } },
      h('th', { scope: 'row' }, t.name, h('span', { class: 'desc muted' }, `id ${t.id}`)),
      h('td', {}, t.owner),
      h('td', { class: 'num' }, String(t.peers_online)),
      h('td', {}, t.last_used_at ? timeEl(t.last_used_at, fmtRelative(t.last_used_at)) : h('span', { class: 'muted' }, 'never')),
      h('td', {}, t.revoked_at ? h('span', { class: 'badge failed' }, 'revoked') : h('button', { type: 'button', class: 'secondary', onclick: () => revokeToken(t) }, 'Revoke')),
    )));
    tokenEmpty.hidden = tokens.length > 0;
  }

  main.append(
    h('h1', {}, 'Peers'),
    h('p', { class: 'lead' }, 'Volunteer computers that lease work from this supernode. Their power (speed × idle fraction) decides how much of the ring — and so how many processes — each gets.'),
    h(
      'section',
      { 'aria-labelledby': 'peers-heading' },
      h('h2', { id: 'peers-heading' }, 'All peers'),
      empty,
      scrollTable(
        'Peers',
        h('table', { id: 'peers' }, h('thead', {}, h('tr', {}, ['Peer', 'State', 'Speed', 'Idle', 'Cores', 'Lease expires', 'Processes', 'Memory', 'Address', 'Links'].map((t) => colHead(t)))), tbody),
      ),
    ),
    h(
      'section',
      { 'aria-labelledby': 'tokens-heading' },
      h('h2', { id: 'tokens-heading' }, 'Enrollment tokens'),
      h('p', { class: 'muted small' }, 'The supernode admits only peers that log in with an enrollment token. Revoking a token stops its peers at once.'),
      tokenForm,
      tokenShown,
      tokenEmpty,
      scrollTable('Enrollment tokens', h('table', { id: 'tokens' }, h('thead', {}, h('tr', {}, ['Token', 'Owner', 'Peers online', 'Last used', ''].map((t) => colHead(t)))), tokenBody)),
    ),
    h(
      'section',
      { 'aria-labelledby': 'ring-heading' },
      h('h2', { id: 'ring-heading' }, 'The DHHT ring'),
      h('p', { class: 'muted small' }, 'Each peer sits at a golden-ratio position; a process at position x goes to the peer with the lowest ((x − position) mod 1) / weight. Arcs show which peer wins each part of the ring; dots inside are running processes, coloured by their peer.'),
      ringNote,
      h(
        'div',
        { class: 'ring-layout' },
        ringBox,
        h(
          'div',
          {},
          scrollTable('Ring shares', h('table', { id: 'ring-legend' }, h('thead', {}, h('tr', {}, ['Peer', 'Position', 'Weight', 'Share', 'Processes'].map((t) => colHead(t)))), ringLegend)),
          procDetails,
        ),
      ),
    ),
  );

  // Resident memory, and what its jobs hold for fault tolerance (retained
  // messages, other peers' checkpoints), from its last renewal.
  function peerMemory(m) {
    if (!m || !m.rss_bytes) return h('td', { class: 'muted' }, '—');
    return h(
      'td',
      { class: 'num', title: 'Resident memory of the peer; "held": bytes its jobs keep for fault tolerance (retained messages, checkpoints of other peers’ processes)' },
      fmtBytes(m.rss_bytes),
      h('span', { class: 'desc muted' }, `held ${fmtBytes(m.held_bytes)}`),
    );
  }

  // "cluster a" for a cluster its volunteer named, "cluster found-3
  // (measured)" for one the supernode found from the measured links.
  function peerClusterText(p) {
    const owner = p.owner ? ` · ${p.owner}’s` : '';
    if (!p.cluster) return `id ${p.id}${owner}`;
    const how = p.cluster === p.found_cluster ? ' (measured)' : (p.found_cluster ? ` (links say ${p.found_cluster})` : '');
    return `id ${p.id}${owner} · cluster ${p.cluster}${how}`;
  }

  function peerState(p) {
    const badge = p.quarantined
      ? h('span', { class: 'badge failed', title: `Quarantined: ${p.quarantined}` }, 'quarantined')
      : p.disabled ? h('span', { class: 'badge failed' }, 'disabled') : h('span', { class: `badge peer-${p.state}` }, p.state);
    if (!canChange(p)) return h('td', {}, badge);
    const action = p.disabled
      ? h('button', { type: 'button', class: 'secondary small-btn', onclick: () => setPeerDisabled(p, false) }, 'Enable')
      : h('button', { type: 'button', class: 'secondary small-btn', onclick: () => setPeerDisabled(p, true) }, 'Disable');
    return h('td', {}, badge, ' ', action);
  }

  function peerRow(p) {
    const idle = Math.max(0, Math.min(1, p.idle));
    return h(
      'tr',
      { dataset: { peer: p.id, state: p.state } },
      h('th', { scope: 'row' }, h('span', { class: 'peer-name' }, p.name), h('span', { class: 'desc muted' }, peerClusterText(p))),
      peerState(p),
      h('td', { class: 'num' }, p.speed.toFixed(2)),
      h('td', {}, h('meter', { min: 0, max: 1, low: 0.05, optimum: 1, value: idle, 'aria-label': `idle ${pct(idle)}` }), ' ', pct(idle)),
      h('td', { class: 'num' }, String(p.cores)),
      h('td', {}, p.state === 'gone' ? h('span', { class: 'muted' }, 'expired ', timeEl(p.lease_expires_at, fmtRelative(p.lease_expires_at))) : timeEl(p.lease_expires_at, fmtRelative(p.lease_expires_at))),
      h('td', { class: 'num' }, String(p.processes)),
      peerMemory(p.memory),
      h('td', {}, h('code', {}, p.addr)),
      peerLinks(p),
    );
  }

  // The links the peer measured to others (round trip, bandwidth), newest
  // measurement of each; peers measure a few per lease renewal.
  function peerLinks(p) {
    const links = p.links || [];
    if (!links.length) return h('td', { class: 'muted', title: 'No link measured yet (or link probes are turned off on this peer)' }, '—');
    const name = (id) => peerCache.find((q) => q.id === id)?.name ?? `peer ${id}`;
    return h(
      'td',
      {},
      h(
        'details',
        { class: 'peer-links' },
        h('summary', {}, `${links.length} measured`),
        h(
          'ul',
          { class: 'small' },
          ...links.map((l) => h('li', {}, `${name(l.peer)}: ${(l.rtt_us / 1000).toFixed(2)} ms, ${fmtBytes(l.bandwidth_bps)}/s`)),
        ),
      ),
    );
  }

  async function loadPeers() {
    const peers = await api('GET', '/peers', { signal: ctx.signal });
    const order = { online: 0, draining: 1, gone: 2 };
    peers.sort((a, b) => (order[a.state] ?? 3) - (order[b.state] ?? 3) || a.name.localeCompare(b.name));
    peerCache = peers;
    fill(tbody, ...peers.map(peerRow));
    empty.hidden = peers.length > 0;
  }

  async function loadRing() {
    if (!ringSupported) return;
    let ring;
    try {
      ring = await api('GET', '/ring', { signal: ctx.signal });
    } catch (e) {
      if (e.status === 404) {
        ringSupported = false;
        ringNote.textContent = 'This supernode does not describe its ring (GET /api/v1/ring is missing).';
        fill(ringBox);
        return;
      }
      throw e;
    }
    ringNote.textContent = ring.peers.length ? '' : 'No peer is in the ring (none online with a weight above 0).';
    fill(ringBox, ringSvg(ring));
    const counts = new Map();
    for (const pr of ring.processes) counts.set(String(pr.peer), (counts.get(String(pr.peer)) ?? 0) + 1);
    fill(ringLegend,
      ...ring.peers.map((p, i) =>
        h(
          'tr',
          { dataset: { peer: p.id } },
          h('th', { scope: 'row', class: 'peer-name' }, h('span', { class: 'swatch', style: `background:${peerColor(i)}`, 'aria-hidden': 'true' }), ' ', p.name),
          h('td', { class: 'num' }, p.position.toFixed(4)),
          h('td', { class: 'num' }, p.weight.toFixed(2)),
          h('td', { class: 'num' }, pct(p.share)),
          h('td', { class: 'num' }, String(counts.get(String(p.id)) ?? 0)),
        ),
      ),
    );
    const names = new Map(ring.peers.map((p) => [String(p.id), p.name]));
    for (const p of peerCache) if (!names.has(String(p.id))) names.set(String(p.id), p.name);
    fill(procTable,
      ...ring.processes.slice(0, 2000).map((pr) =>
        h('tr', {}, h('td', {}, h('a', { href: `#/jobs/${pr.job}` }, `Job ${pr.job}`)), h('td', { class: 'num' }, String(pr.pid)), h('td', { class: 'num' }, pr.position.toFixed(4)), h('td', {}, names.get(String(pr.peer)) ?? `peer ${pr.peer}`)),
      ),
    );
    procDetails.querySelector('summary').textContent = `Processes on the ring (${ring.processes.length})`;
  }

  ctx.poll(PEER_POLL_MS, async () => {
    await loadPeers();
    await loadRing();
  }, 'peers');
  loadTokens().catch((e) => { if (e.name !== 'AbortError') showError(e); });
}

// ----------------------------------------------------------------------- boot

async function loadHealth() {
  try {
    const res = await fetch(`${API}/health`, { cache: 'no-store' });
    if (!res.ok) return;
    const hl = await res.json();
    $('#health').textContent = `Supernode ${hl.version}, API v${hl.api_version}, ${hl.peers_online} peer${hl.peers_online === 1 ? '' : 's'} online.`;
    // A disk that takes no writes is shown until it does again.
    if (hl.storage_problem) showError(`Storage problem: ${hl.storage_problem}`, 'storage');
    else clearError('storage');
  } catch {
    $('#health').textContent = 'The supernode is not reachable.';
  }
}

function boot() {
  $('#alert-close').addEventListener('click', () => clearError());
  $('#sign-out').addEventListener('click', () => {
    saveSession(null);
    userEvents.stop();
    programsCache = null;
    signInMessage = '';
    returnTo = '';
    clearError();
    notify('Signed out.');
    if (location.hash && location.hash !== '#/jobs') location.hash = '#/jobs';
    render();
  });
  window.addEventListener('hashchange', render);
  saveSession(session); // arms the expiry timer
  render();
  loadHealth();
  setInterval(loadHealth, 30000);
}

if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', boot);
else boot();
