// Browser test of the bspweb web UI.
//
// Starts the real product (`target/release/bspweb up --peers 3` on a free
// port with a fresh data directory), waits for its peers, and drives Debian's
// Chromium through playwright-core: sign in, upload programs (a good one and a
// bad one), submit jobs and watch their output stream, see the job list change
// by the event stream alone, kill a long job, see a mandelbrot drawn on a
// canvas row by row across forced stream reconnects, jobs that fail, abort
// and flood their output, pictures in raw output, "Submit again" links with
// awkward characters, and look at the peers and the DHHT ring. Screenshots go
// to target/screenshots/.
//
// Throughout: any Content-Security-Policy violation, uncaught error or console
// error fails the running step at once, and every page visited is checked for
// form fields without a label.
//
// Exits 0 when everything passed, 1 with a message naming the failed step
// otherwise. `bspweb up` (and its peers) is always stopped and the temporary
// directory removed, also on failure, exception or Ctrl-C.
//
// Environment: BSPWEB_BIN (default target/release/bspweb), CHROMIUM (default
// /usr/bin/chromium), BROWSER_TEST_HEADFUL=1 to watch.

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import zlib from 'node:zlib';
import { chromium } from 'playwright-core';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '..', '..');
const BIN = process.env.BSPWEB_BIN || path.join(ROOT, 'target', 'release', 'bspweb');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SHOTS = path.join(ROOT, 'target', 'screenshots');
const GUESTS = path.join(ROOT, 'target', 'guests');
const PASSWORD = `browser-test-${process.pid}-${Date.now()}`;
const PEERS = 3;
const EXAMPLES = ['ring', 'mandelbrot', 'inner-product', 'sample-sort', 'broadcast', 'supersteps', 'pagerank'];

// Deadlines. Generous: the machine may be busy compiling; waits end as soon as
// their condition holds.
const STARTUP_MS = 180_000;
const UI_MS = 20_000;
const JOB_MS = 180_000;

const started = Date.now();
const elapsed = () => `${((Date.now() - started) / 1000).toFixed(1)} s`;
const log = (...a) => console.log(`[browser-test ${elapsed()}]`, ...a);

// ------------------------------------------------------------------ cleanup

let tmp = null;
let server = null; // ChildProcess of `bspweb up`
let extraPeer = null; // a `bspweb peer` of the test's own, with its own idle file
let serverOut = '';
let context = null;
let cleaning = null;

async function stopServer() {
  if (!server) return;
  const child = server;
  server = null;
  const exited = new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', resolve);
  });
  // SIGINT lets `bspweb up` stop its peers and the supernode in order.
  try {
    process.kill(child.pid, 'SIGINT');
  } catch {
    // already gone
  }
  const timedOut = await Promise.race([exited.then(() => false), delay(15_000).then(() => true)]);
  if (timedOut) log('bspweb up did not stop within 15 s of SIGINT; sending SIGKILL');
  // Kill the whole process group (the peers too), whatever happened above.
  try {
    process.kill(-child.pid, 'SIGKILL');
  } catch {
    // no process left in the group
  }
  await Promise.race([exited, delay(5_000)]);
}

function cleanup() {
  if (cleaning) return cleaning;
  cleaning = (async () => {
    if (context) {
      const c = context;
      context = null;
      await Promise.race([c.close().catch(() => {}), delay(10_000)]);
    }
    if (extraPeer && extraPeer.exitCode === null && extraPeer.signalCode === null) {
      const exited = new Promise((resolve) => extraPeer.once('exit', resolve));
      extraPeer.kill('SIGKILL');
      await Promise.race([exited, delay(10_000)]);
    }
    await stopServer();
    if (tmp) {
      fs.rmSync(tmp, { recursive: true, force: true });
      tmp = null;
    }
  })();
  return cleaning;
}

let interrupted = null;
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, async () => {
    if (interrupted) return;
    interrupted = sig;
    log(`${sig}: stopping bspweb up and Chromium`);
    await cleanup();
    process.exit(130);
  });
}

function delay(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

// -------------------------------------------------------------------- steps

class StepFailure extends Error {}

let currentStep = '(setup)';
let failRunningStep = null; // rejects the running step's race
let lateFailure = null; // a failure reported between steps
/**
 * Fails the running step at once, from outside its own code (a route
 * handler, a page event), instead of letting it time out later.
 */
function failStep(err) {
  const e = err instanceof Error ? err : new StepFailure(String(err));
  if (failRunningStep) failRunningStep(e);
  else lateFailure ??= e;
}

async function step(name, fn) {
  currentStep = name;
  const t0 = Date.now();
  log(`▶ ${name}`);
  if (lateFailure) throw lateFailure;
  const failed = new Promise((_, reject) => {
    failRunningStep = reject;
  });
  try {
    await Promise.race([fn(), failed]);
  } finally {
    failRunningStep = null;
  }
  if (lateFailure) throw lateFailure;
  log(`✓ ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

function check(cond, message) {
  if (!cond) throw new StepFailure(message);
}

// ---------------------------------------------------------------- the server

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

async function startServer() {
  check(fs.existsSync(BIN), `${BIN} does not exist; build it with: cargo build --release --bin bspweb`);
  const port = await freePort();
  const data = path.join(tmp, 'data');
  const config = path.join(tmp, 'config');
  fs.mkdirSync(config, { recursive: true });
  const base = `http://127.0.0.1:${port}`;
  // The peers report full availability whatever else loads this machine, so
  // the busy-peer rule never migrates processes mid-test.
  const idle = path.join(tmp, 'idle');
  fs.writeFileSync(idle, '1.0\n');
  // Short leases, so a killed peer is noticed within seconds.
  server = spawn(BIN, ['up', '--listen', `127.0.0.1:${port}`, '--data', data, '--peers', String(PEERS), '--idle-file', idle, '--lease-ttl-secs', '5', '--cluster-step-ms', '100'], {
    env: {
      ...process.env,
      BSPWEB_USER: 'admin',
      BSPWEB_PASSWORD: PASSWORD,
      // `bspweb up` saves a CLI session; keep it out of the user's config.
      BSPWEB_CONFIG_DIR: config,
      XDG_CONFIG_HOME: config,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true, // its own process group, so the peers can be killed with it
  });
  const keep = (chunk) => {
    serverOut += chunk.toString();
    if (serverOut.length > 200_000) serverOut = serverOut.slice(-100_000);
  };
  server.stdout.on('data', keep);
  server.stderr.on('data', keep);
  const child = server;
  let exitInfo = null;
  child.on('exit', (code, signal) => {
    exitInfo = { code, signal };
  });

  const deadline = Date.now() + STARTUP_MS;
  let last = 'no answer yet';
  while (Date.now() < deadline) {
    if (exitInfo) throw new StepFailure(`bspweb up exited early (code ${exitInfo.code}, signal ${exitInfo.signal}):\n${serverOut}`);
    try {
      const res = await fetch(`${base}/api/v1/health`, { signal: AbortSignal.timeout(2000) });
      if (res.ok) {
        const health = await res.json();
        last = `${health.peers_online} peers online`;
        if (health.peers_online >= PEERS) return { base, data };
      } else {
        last = `health answered ${res.status}`;
      }
    } catch (e) {
      last = e.message;
    }
    await delay(200);
  }
  throw new StepFailure(`the supernode did not show ${PEERS} peers online within ${STARTUP_MS / 1000} s (last: ${last})`);
}

async function apiToken(base) {
  const res = await fetch(`${base}/api/v1/login`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ name: 'admin', password: PASSWORD }),
  });
  check(res.ok, `logging in through the API failed: ${res.status}`);
  return (await res.json()).token;
}

// A tiny guest made here, byte by byte: `bspweb_resume` writes each of
// `records` with `write_raw` and returns STATUS_DONE (1); no stack, no
// globals. Enough for output the bundled examples never produce (pictures).
function rawWriterWasm(records) {
  const uleb = (n) => {
    const out = [];
    do {
      let b = n & 0x7f;
      n >>>= 7;
      if (n) b |= 0x80;
      out.push(b);
    } while (n);
    return out;
  };
  const sleb = (n) => {
    const out = [];
    for (;;) {
      const b = n & 0x7f;
      n >>= 7;
      if ((n === 0 && !(b & 0x40)) || (n === -1 && b & 0x40)) return [...out, b];
      out.push(b | 0x80);
    }
  };
  const name = (s) => [...uleb(Buffer.byteLength(s)), ...Buffer.from(s)];
  const vec = (items) => [...uleb(items.length), ...items.flat()];
  const section = (id, bytes) => [id, ...uleb(bytes.length), ...bytes];
  const BASE = 1024; // where the records sit in memory
  let end = BASE;
  const calls = records.flatMap((r) => {
    const at = end;
    end += r.length;
    // write_raw(at, len); drop its result
    return [0x41, ...sleb(at), 0x41, ...sleb(r.length), 0x10, 0x00, 0x1a];
  });
  const body = [0x00 /* no locals */, ...calls, 0x41, 0x01 /* STATUS_DONE */, 0x0b];
  return Buffer.from([
    ...[0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00],
    ...section(1, vec([[0x60, 0x02, 0x7f, 0x7f, 0x01, 0x7f], [0x60, 0x00, 0x01, 0x7f]])), // (i32 i32)->i32, ()->i32
    ...section(2, vec([[...name('bspweb_v1'), ...name('write_raw'), 0x00, 0x00]])),
    ...section(3, vec([[0x01]])),
    ...section(5, vec([[0x00, ...uleb(Math.ceil(end / 65536))]])),
    ...section(7, vec([[...name('memory'), 0x02, 0x00], [...name('bspweb_resume'), 0x00, 0x01]])),
    ...section(10, vec([[...uleb(body.length), ...body]])),
    ...section(11, vec([[0x00, 0x41, ...sleb(BASE), 0x0b, ...uleb(end - BASE), ...Buffer.concat(records)]])),
  ]);
}

function crc32(buf) {
  let c = ~0;
  for (const b of buf) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return ~c >>> 0;
}

/** A `w`×`h` RGB PNG: red rises to the right, green downwards. */
function pngImage(w, h) {
  const chunk = (type, data) => {
    const head = Buffer.alloc(4);
    head.writeUInt32BE(data.length);
    const typed = Buffer.concat([Buffer.from(type, 'latin1'), data]);
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(crc32(typed));
    return Buffer.concat([head, typed, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8; // bits per sample
  ihdr[9] = 2; // RGB
  const rows = [];
  for (let y = 0; y < h; y++) {
    const row = Buffer.alloc(1 + 3 * w); // filter byte 0, then pixels
    for (let x = 0; x < w; x++) row.set([Math.round((255 * x) / (w - 1)), Math.round((255 * y) / (h - 1)), 128], 1 + 3 * x);
    rows.push(row);
  }
  const signature = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  return Buffer.concat([signature, chunk('IHDR', ihdr), chunk('IDAT', zlib.deflateSync(Buffer.concat(rows))), chunk('IEND', Buffer.alloc(0))]);
}

/** The events of a text/event-stream body, as parsed JSON data. */
function parseSse(text) {
  return text
    .split(/\r?\n\r?\n/)
    .map((block) => block.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n'))
    .filter((data) => data)
    .map((data) => JSON.parse(data));
}

function findGuest(name) {
  const hits = [];
  const walk = (dir) => {
    let entries = [];
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name === name) hits.push(p);
    }
  };
  walk(GUESTS);
  check(hits.length > 0, `no ${name} under ${GUESTS}; build the guests with: cargo build --release --bin bspweb`);
  hits.sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
  return hits[0];
}

// ------------------------------------------------------------------ the test

async function main() {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'bspweb-browser-'));
  fs.mkdirSync(SHOTS, { recursive: true });
  fs.rmSync(path.join(SHOTS, 'failure.png'), { force: true }); // from an earlier run
  check(fs.existsSync(CHROMIUM), `${CHROMIUM} does not exist; install it with: apt-get install -y chromium`);

  let base;
  let dataDir;
  await step(`start bspweb up with ${PEERS} peers`, async () => {
    ({ base, data: dataDir } = await startServer());
    log(`supernode at ${base}`);
  });
  const token = await apiToken(base);
  const apiCall = async (method, p, body, contentType = 'application/json') => {
    const headers = { Authorization: `Bearer ${token}` };
    if (body !== undefined) headers['Content-Type'] = contentType;
    const payload = body === undefined || Buffer.isBuffer(body) ? body : JSON.stringify(body);
    const res = await fetch(`${base}/api/v1${p}`, { method, headers, body: payload });
    return { status: res.status, body: res.headers.get('content-type')?.includes('json') ? await res.json() : await res.text() };
  };
  const apiGet = (p) => apiCall('GET', p);
  const apiPost = async (p, body, contentType) => {
    const r = await apiCall('POST', p, body, contentType);
    check(r.status >= 200 && r.status < 300, `POST ${p} failed: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body;
  };
  const submitJob = (spec) => apiPost('/jobs', spec);
  /** Every event of a finished job (its stream ends after the last one). */
  const jobEvents = async (id) => {
    const res = await fetch(`${base}/api/v1/jobs/${id}/events`, { headers: { Authorization: `Bearer ${token}`, Accept: 'text/event-stream' }, signal: AbortSignal.timeout(60_000) });
    check(res.ok, `GET /jobs/${id}/events answered ${res.status}`);
    return parseSse(await res.text());
  };
  // The features the lead engineer adds in parallel; absent ones are reported, and fail the test.
  const ringAvailable = (await apiGet('/ring')).status === 200;

  await step('the UI files come with a strict Content-Security-Policy, nosniff and no-referrer', async () => {
    for (const file of ['/', '/index.html', '/app.js', '/app.css', '/api/docs']) {
      const res = await fetch(`${base}${file}`);
      check(res.ok, `GET ${file} answered ${res.status}`);
      const csp = res.headers.get('content-security-policy') ?? '';
      for (const want of ["default-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "object-src 'none'", 'img-src ']) {
        check(csp.includes(want), `the Content-Security-Policy of ${file} lacks ${want}: "${csp}"`);
      }
      check(!/unsafe-inline|unsafe-eval|\*/.test(csp), `the Content-Security-Policy of ${file} allows too much: "${csp}"`);
      check(res.headers.get('x-content-type-options') === 'nosniff', `${file} has no X-Content-Type-Options: nosniff`);
      check(res.headers.get('referrer-policy') === 'no-referrer', `${file} has no Referrer-Policy: no-referrer`);
    }
  });

  await step('launch Chromium', async () => {
    context = await chromium.launchPersistentContext(path.join(tmp, 'chromium-profile'), {
      executablePath: CHROMIUM,
      headless: !process.env.BROWSER_TEST_HEADFUL,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'].filter(
        (a) => a !== '--headless' || !process.env.BROWSER_TEST_HEADFUL,
      ),
      viewport: { width: 1280, height: 900 },
      acceptDownloads: false,
      timeout: 60_000,
      // Our own signal handlers stop bspweb up too; Playwright's would exit first.
      handleSIGINT: false,
      handleSIGTERM: false,
      handleSIGHUP: false,
    });
  });
  context.setDefaultTimeout(UI_MS);

  // Reports from inside every page: Content-Security-Policy violations, and
  // form fields without a label on each page shown.
  const cspViolations = [];
  let cspSelfTest = null; // the detector's own test collects instead of failing
  const fieldChecks = new Map(); // what was checked -> unlabelled fields
  await context.exposeBinding('bspwebTestReport', (_source, kind, detail) => {
    if (kind === 'csp') {
      if (cspSelfTest) return cspSelfTest.push(detail);
      cspViolations.push(detail);
      failStep(new StepFailure(`Content-Security-Policy violation: ${detail}`));
    } else if (kind === 'fields') {
      const { page: where, bad } = JSON.parse(detail);
      fieldChecks.set(where, bad);
      if (bad.length) failStep(new StepFailure(`form fields without labels on ${where}: ${bad.join(', ')}`));
    }
  });
  await context.addInitScript(() => {
    window.addEventListener(
      'securitypolicyviolation',
      (e) => window.bspwebTestReport('csp', `${e.effectiveDirective} refused ${e.blockedURI || 'inline code'} at ${e.sourceFile || location.href}:${e.lineNumber}`),
      true,
    );
    const reported = new Set();
    let timer = null;
    const checkFields = () => {
      timer = null;
      const h1 = document.querySelector('main h1, body h1')?.textContent ?? '';
      const where = `${location.pathname}${location.hash} (${h1})`;
      const bad = [...document.querySelectorAll('main input, main select, main textarea')]
        .filter((el) => el.type !== 'hidden' && !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.getAttribute('aria-labelledby'))
        .map((el) => el.id || el.name || el.outerHTML.slice(0, 60));
      if (bad.length || !reported.has(where)) window.bspwebTestReport('fields', JSON.stringify({ page: where, bad }));
      reported.add(where);
    };
    new MutationObserver(() => {
      timer ??= setTimeout(checkFields, 100);
    }).observe(document, { childList: true, subtree: true });
  });

  const jsErrors = [];
  const watch = (p) => {
    p.on('pageerror', (e) => {
      jsErrors.push(`uncaught: ${e.message}`);
      failStep(new StepFailure(`uncaught JavaScript error in the page: ${e.message}`));
    });
    p.on('console', (m) => {
      // CSP violations are caught (with more detail) by the listener above.
      if (m.type() !== 'error' || /Failed to load resource|Content Security Policy/.test(m.text())) return;
      jsErrors.push(`console: ${m.text()}`);
      failStep(new StepFailure(`JavaScript error in the page's console: ${m.text()}`));
    });
    p.on('dialog', (d) => d.accept().catch(() => {}));
  };
  const page = context.pages()[0] || (await context.newPage());
  watch(page);
  const eventRequests = []; // { url, lastEventId }
  page.on('request', (r) => {
    if (/\/api\/v1\/(jobs\/\d+\/)?events/.test(r.url())) eventRequests.push({ url: r.url(), lastEventId: r.headers()['last-event-id'] ?? null });
  });
  // Nothing may be fetched from anywhere but the supernode.
  const foreign = [];
  await context.route('**/*', (route) => {
    const url = route.request().url();
    if (url.startsWith(base) || url.startsWith('data:') || url.startsWith('blob:')) return route.continue();
    foreign.push(url);
    return route.abort();
  });

  const shot = async (name) => {
    await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
  };
  const text = (sel) => page.locator(sel).innerText();
  const jobIdFromUrl = () => {
    const m = /#\/jobs\/(\d+)$/.exec(page.url());
    check(m, `expected a job page, the URL is ${page.url()}`);
    return Number(m[1]);
  };
  const terminalText = () => text('#timeline li.terminal');

  await step('sign in (a wrong password is refused with a message)', async () => {
    await page.goto(`${base}/#/jobs`);
    await page.waitForSelector('h1:has-text("Sign in")');
    check((await page.locator('main[id="main"]').count()) === 1, 'the page has no <main> landmark');
    check((await page.locator('nav[aria-label="Main"]').count()) === 1, 'the page has no main <nav>');
    await page.fill('#signin-name', 'admin');
    await page.fill('#signin-password', 'wrong password');
    await page.click('form button[type=submit]');
    await page.waitForSelector('.form-error:visible');
    check(/Cannot sign in/i.test(await text('.form-error')), `no clear message for a wrong password: ${await text('.form-error')}`);
    await shot('signin');
    await page.fill('#signin-password', PASSWORD);
    await page.click('form button[type=submit]');
    await page.waitForSelector('h1:has-text("Jobs")');
    await page.waitForSelector('#account-name:has-text("admin")');
    const stored = await page.evaluate(() => sessionStorage.getItem('bspweb.session'));
    check(stored && JSON.parse(stored).token, 'the token is not kept in sessionStorage');
  });

  await step('programs: the examples are listed as builtin', async () => {
    await page.click('#nav a[href="#/programs"]');
    await page.waitForSelector('h1:has-text("Programs")');
    for (const name of EXAMPLES) {
      const row = page.locator(`#programs tr[data-program="${name}"]`);
      await row.waitFor();
      check(/builtin/.test(await row.innerText()), `${name} is not marked builtin`);
      check((await row.locator('button:has-text("Delete")').count()) === 0, `builtin ${name} offers a Delete button`);
    }
  });

  const ringWasm = findGuest('ring.wasm');
  await step(`programs: upload ${path.relative(ROOT, ringWasm)} as my-ring`, async () => {
    await page.setInputFiles('#upload-file', ringWasm);
    await page.fill('#upload-name', 'my-ring');
    await page.fill('#upload-description', 'the ring example, uploaded by the browser test');
    await page.click('#upload-button');
    const row = page.locator('#programs tr[data-program="my-ring"]');
    await row.waitFor();
    const rowText = await row.innerText();
    check(/yours/.test(rowText), `my-ring is not listed as the user's: ${rowText}`);
    const size = fs.statSync(ringWasm).size;
    check(rowText.includes(size < 1024 ? `${size} B` : 'KiB'), `my-ring's size is not shown: ${rowText}`);
  });

  await step('programs: a bad file is refused with the server\'s message', async () => {
    const bad = Buffer.from('this is not a WebAssembly module\n');
    // What the server says about these bytes, to compare with what the page shows.
    const res = await fetch(`${base}/api/v1/programs?name=bad`, { method: 'POST', headers: { Authorization: `Bearer ${token}` }, body: bad });
    check(!res.ok, 'the server accepted a bad module');
    const { message } = await res.json();
    await page.setInputFiles('#upload-file', { name: 'bad.wasm', mimeType: 'application/wasm', buffer: bad });
    await page.fill('#upload-name', 'bad');
    await page.click('#upload-button');
    await page.waitForSelector('#upload-error:visible');
    const shown = await text('#upload-error');
    check(shown.includes(message), `the upload error does not show the server's message "${message}": "${shown}"`);
    check((await page.locator('#programs tr[data-program="bad"]').count()) === 0, 'the bad program is listed');
    await shot('programs');
  });

  await step('programs: delete my-ring', async () => {
    await page.click('#programs tr[data-program="my-ring"] button:has-text("Delete")');
    await page.locator('#programs tr[data-program="my-ring"]').waitFor({ state: 'detached' });
    check((await apiGet('/programs')).body.every((p) => p.name !== 'my-ring'), 'my-ring is still stored after Delete');
  });

  let ringJob;
  await step('submit: bad JSON arguments get a clear message; ring runs and its output streams', async () => {
    await page.click('#nav a[href="#/submit"]');
    await page.waitForSelector('h1:has-text("Submit a job")');
    await page.waitForSelector('#submit-program option[value="ring"]', { state: 'attached' });
    await page.selectOption('#submit-program', 'ring');
    await page.fill('#submit-nprocs', '4');
    await page.fill('#submit-args', '{"oops": ');
    await page.click('#submit-button');
    await page.waitForSelector('#args-error:visible');
    check(/not valid JSON/.test(await text('#args-error')), `unclear message for bad JSON: ${await text('#args-error')}`);
    check((await page.getAttribute('#submit-args', 'aria-invalid')) === 'true', 'the bad arguments are not marked aria-invalid');
    check(/#\/submit/.test(page.url()), 'a job was submitted with bad JSON arguments');
    await shot('submit');
    await page.fill('#submit-args', '');
    await page.fill('#submit-description', 'ring from the browser test');
    await page.click('#submit-button');
    await page.waitForURL(/#\/jobs\/\d+$/);
    ringJob = jobIdFromUrl();
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
    const terminal = await text('#timeline li.terminal');
    check(/exited/.test(terminal), `the ring job did not exit normally: ${terminal}`);
    // Every process prints "got in total 2 messages" (left and right neighbour).
    await page.waitForFunction(() => [...document.querySelectorAll('#output .line.stdout')].filter((l) => l.textContent.includes('got in total 2 messages')).length === 4, null, { timeout: UI_MS });
    const ids = await page.$$eval('#output .line', (ls) => ls.map((l) => l.dataset.id));
    check(new Set(ids).size === ids.length, 'an output line is shown twice');
    await page.waitForSelector('#job-state:has-text("finished: exited")');
    await shot('job-ring');
  });

  await step('job page: filter the output by pid and stream', async () => {
    await page.selectOption('#filter-pid', '2');
    const pids = await page.$$eval('#output .line.stdout', (ls) => ls.map((l) => l.dataset.pid));
    check(pids.length > 0 && pids.every((p) => p === '2'), `the pid filter shows other pids: ${pids}`);
    await page.uncheck('#filter-stdout');
    check((await page.locator('#output .line.stdout').count()) === 0, 'stdout lines are shown with stdout unticked');
    await page.check('#filter-stdout');
    await page.selectOption('#filter-pid', '');
    check((await page.locator('#output .line.stdout').count()) >= 16, 'not all ring output is back after clearing the filters');
  });

  await step('job page: a stream cut in the middle of an event resumes with Last-Event-ID', async () => {
    const before = await page.$$eval('#output .line', (ls) => ls.map((l) => l.textContent));
    const timelineBefore = await page.locator('#timeline li').count();
    let cutAfter = null;
    const eventsUrl = `**/api/v1/jobs/${ringJob}/events`;
    await page.route(eventsUrl, async (route) => {
      if (cutAfter !== null) return route.continue();
      try {
        const res = await route.fetch();
        const events = (await res.text()).split('\n\n').filter((e) => e.trim());
        check(events.length > 8, `the ring job's stream has only ${events.length} events`);
        const keep = 6;
        cutAfter = /^id: ?(\d+)$/m.exec(events[keep - 1])?.[1];
        check(cutAfter, `no id line in the event ${events[keep - 1]}`);
        // Six whole events, then half of the seventh: the page must not show the half.
        const body = `${events.slice(0, keep).join('\n\n')}\n\n${events[keep].slice(0, Math.floor(events[keep].length / 2))}`;
        await route.fulfill({ status: 200, headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' }, body });
      } catch (e) {
        // A failed check here fails the step now, not by a timeout later.
        failStep(e);
        await route.abort().catch(() => {});
      }
    });
    const requestsBefore = eventRequests.length;
    await page.goto(`${base}/#/jobs`);
    await page.waitForSelector('h1:has-text("Jobs")');
    await page.goto(`${base}/#/jobs/${ringJob}`);
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
    await page.waitForFunction((n) => document.querySelectorAll('#output .line').length >= n, before.length);
    const after = await page.$$eval('#output .line', (ls) => ls.map((l) => l.textContent));
    check(JSON.stringify(after) === JSON.stringify(before), `the output differs after a cut stream:\n    before: ${before.join(' | ')}\n    after:  ${after.join(' | ')}`);
    check((await page.locator('#timeline li').count()) === timelineBefore, 'the events timeline differs after a cut stream');
    const resumed = eventRequests.slice(requestsBefore).filter((r) => r.url.includes(`/jobs/${ringJob}/events`));
    check(resumed.length >= 2 && resumed.at(-1).lastEventId === cutAfter, `the reconnect did not send Last-Event-ID ${cutAfter}: ${JSON.stringify(resumed)}`);
    await page.unroute(eventsUrl);
  });

  let longJob;
  await step('submit a long supersteps job; it shows as active with progress', async () => {
    await page.goto(`${base}/#/submit?program=supersteps`);
    await page.waitForSelector('#submit-program option[value="supersteps"]', { state: 'attached' });
    check((await page.inputValue('#submit-program')) === 'supersteps', 'the program in the link was not preselected');
    await page.fill('#submit-nprocs', '3');
    await page.fill('#submit-args', '{"k": 100000000, "h": 64}');
    await page.fill('#submit-description', 'long job to kill');
    await page.click('#submit-button');
    await page.waitForURL(/#\/jobs\/\d+$/);
    longJob = jobIdFromUrl();
    await page.waitForSelector('#job-state:has-text("active")', { timeout: JOB_MS });
    // Per-process progress (JobInfo.supersteps), polled.
    await page.waitForFunction(
      () => {
        const cells = [...document.querySelectorAll('#progress td.supersteps')];
        return cells.length === 3 && cells.every((c) => Number(c.textContent) > 0);
      },
      null,
      { timeout: JOB_MS },
    );
    await shot('job-active');
    // The jobs page lists it as active, live.
    await page.click('#nav a[href="#/jobs"]');
    await page.waitForSelector(`#jobs-active tr[data-job="${longJob}"]`);
    await page.waitForSelector(`#jobs-finished tr[data-job="${ringJob}"]`);
    await page.waitForSelector('#live-status[data-status="live"]', { timeout: UI_MS });
    await shot('jobs');
  });

  await step('jobs page: with polling paused, the event stream alone adds a submitted job and moves a killed one', async () => {
    await page.waitForSelector('#live-status[data-status="live"]', { timeout: UI_MS });
    check((await page.evaluate(() => window.bspweb.pausePolling(true))) === true, 'window.bspweb.pausePolling is missing');
    const checksBefore = await page.evaluate(() => window.bspweb.timedChecks());
    const LIVE_MS = UI_MS;
    try {
      const t0 = Date.now();
      const job = await submitJob({ program: 'supersteps', nprocs: 2, args: { k: 100000000, h: 64 }, description: 'live update test' });
      const row = `#jobs-waiting tr[data-job="${job.id}"], #jobs-active tr[data-job="${job.id}"]`;
      await page.waitForSelector(row, { timeout: LIVE_MS }).catch(() => {
        throw new StepFailure(`job ${job.id}, submitted through the API, did not appear on the jobs page within ${LIVE_MS} ms with polling paused`);
      });
      log(`  the submitted job appeared after ${Date.now() - t0} ms`);
      const t1 = Date.now();
      const killed = await apiCall('POST', `/jobs/${job.id}/kill`);
      check(killed.status === 200, `killing job ${job.id} through the API failed: ${killed.status} ${JSON.stringify(killed.body)}`);
      await page.waitForSelector(`#jobs-finished tr[data-job="${job.id}"]`, { timeout: LIVE_MS }).catch(() => {
        throw new StepFailure(`job ${job.id}, killed through the API, did not move to Finished within ${LIVE_MS} ms with polling paused`);
      });
      check((await page.locator(row).count()) === 0, `killed job ${job.id} is still listed as waiting or active`);
      check(/killed/.test(await page.locator(`#jobs-finished tr[data-job="${job.id}"]`).innerText()), `job ${job.id}'s row does not say killed`);
      log(`  the killed job moved after ${Date.now() - t1} ms`);
      const checksAfter = await page.evaluate(() => window.bspweb.timedChecks());
      check(checksAfter === checksBefore, `${checksAfter - checksBefore} timed checks ran while polling was paused`);
    } finally {
      await page.evaluate(() => window.bspweb.pausePolling(false)).catch(() => {});
    }
  });

  await step('peers page: peers with lease, speed, idle, state, processes; the ring SVG', async () => {
    await page.click('#nav a[href="#/peers"]');
    await page.waitForSelector('h1:has-text("Peers")');
    await page.waitForFunction((n) => document.querySelectorAll('#peers tr[data-state="online"]').length >= n, PEERS);
    const first = await page.locator('#peers tbody tr').first().innerText();
    check(/online/.test(first) && /in \d/.test(first) && /%/.test(first), `a peer row lacks state, lease expiry or idle: ${first}`);
    // Each online peer's memory, from its renewals: resident size and what its jobs hold.
    await page.waitForFunction(() => [...document.querySelectorAll('#peers tr[data-state="online"]')].every((r) => /MiB[\s\S]*held \d/.test(r.children[7].textContent)));
    const hosted = await page.$$eval('#peers tbody tr', (rs) => rs.reduce((n, r) => n + Number(r.children[6].textContent), 0));
    // The links peers measure to each other (a few per renewal): each online peer lists some.
    await page.waitForFunction(() => [...document.querySelectorAll('#peers tr[data-state="online"]')].every((r) => /\d+ measured/.test(r.children[9].textContent)), null, { timeout: 60_000 });
    const link = await page.$eval('#peers tr[data-state="online"] details.peer-links li', (li) => li.textContent);
    check(/ ms, .*\/s$/.test(link), `a measured link lacks its round trip or bandwidth: ${link}`);
    // The clusters the supernode finds from those links (DiDiC, a step every 100 ms here): one fast
    // loopback network is one cluster, shown under every online peer's name as measured.
    await page.waitForFunction(() => [...document.querySelectorAll('#peers tr[data-state="online"]')].every((r) => /cluster found-\d+ \(measured\)/.test(r.children[0].textContent)), null, { timeout: 60_000 });
    const found = await page.$$eval('#peers tr[data-state="online"] th', (ths) => [...new Set(ths.map((th) => th.textContent.match(/cluster (found-\d+)/)[1]))]);
    check(found.length === 1, `the local peers are in several clusters: ${found.join(', ')}`);
    check(hosted >= 3, `the peers host ${hosted} processes, expected the long job's 3`);
    check(ringAvailable, 'GET /api/v1/ring is missing on this supernode (the ring picture cannot be drawn)');
    await page.waitForSelector('#ring-svg');
    await page.waitForFunction((n) => document.querySelectorAll('#ring-svg circle.ring-peer').length >= n, PEERS);
    await page.waitForFunction(() => document.querySelectorAll('#ring-svg path.ring-arc').length >= 1);
    await page.waitForFunction((job) => document.querySelectorAll(`#ring-svg circle.ring-proc[data-job="${job}"]`).length === 3, longJob);
    const shares = await page.$$eval('#ring-legend tbody tr', (rs) => rs.map((r) => parseFloat(r.children[3].textContent)));
    const sum = shares.reduce((a, b) => a + b, 0);
    check(shares.length >= PEERS && Math.abs(sum - 100) < 1.5, `the ring shares do not add up to 100 %: ${shares}`);
    await shot('peers');
  });

  await step('peers page: enrollment tokens are created (shown once), listed and revoked; peers show their volunteer', async () => {
    await page.goto(`${base}/#/peers`);
    await page.waitForSelector('#tokens');
    // `bspweb up` enrolled its peers with a token of its user's.
    await page.waitForFunction(() => document.querySelectorAll('#tokens tbody tr').length >= 1);
    const owner = await page.locator('#peers tr[data-state="online"] th').first().innerText();
    check(/’s/.test(owner), `a local peer does not show its volunteer: ${owner}`);
    await page.fill('#token-name', 'browser test <&> token');
    await page.click('#token-form button[type="submit"]');
    await page.waitForSelector('#token-secret');
    const secret = (await page.locator('#token-secret').innerText()).trim();
    check(/^bwpeer-\d+-[0-9a-f]{64}$/.test(secret), `the new token looks wrong: ${secret}`);
    const id = secret.split('-')[1];
    await page.waitForSelector(`#tokens tr[data-token="${id}"]`);
    const row = await page.locator(`#tokens tr[data-token="${id}"]`).innerText();
    check(row.includes('browser test <&> token') && !row.includes(secret), `the token row is wrong: ${row}`);
    await page.click(`#tokens tr[data-token="${id}"] button`);
    await page.waitForFunction((t) => /revoked/.test(document.querySelector(`#tokens tr[data-token="${t}"]`)?.textContent ?? ''), id);
    await shot('enrollment-tokens');
  });

  await step('a peer under the long job dies: the timeline shows its process rolled back', async () => {
    await page.goto(`${base}/#/jobs/${longJob}`);
    await page.waitForSelector('#job-state:has-text("active")');
    // The peer that hosts pid 0, and its OS process among `bspweb up`'s children.
    const info = await apiGet(`/jobs/${longJob}`);
    const peers = await apiGet('/peers');
    const host = peers.body.find((p) => p.id === info.body.placement[0]);
    check(host, `no peer ${info.body.placement[0]} hosts pid 0: ${JSON.stringify(info.body.placement)}`);
    const victim = fs
      .readdirSync('/proc')
      .filter((d) => /^\d+$/.test(d))
      .find((d) => {
        try {
          const ppid = Number(fs.readFileSync(`/proc/${d}/stat`, 'utf8').split(') ')[1].split(' ')[1]);
          const argv = fs.readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0');
          return ppid === server.pid && argv.includes('peer') && argv.includes(host.name);
        } catch {
          return false;
        }
      });
    check(victim, `no child process of bspweb up runs peer ${host.name}`);
    process.kill(Number(victim), 'SIGKILL');
    log(`  killed peer ${host.name} (process ${victim}), host of pid 0`);
    await page.waitForFunction(() => [...document.querySelectorAll('#timeline li')].some((li) => /pid 0 was lost with its peer and rolled back/.test(li.textContent)), null, { timeout: JOB_MS });
    await page.waitForFunction(() => /rolled back/.test(document.querySelector('#progress')?.textContent ?? ''), null, { timeout: UI_MS });
    await shot('job-rolled-back');
    // The job goes on: restored, its processes run again.
    await page.waitForSelector('#job-state:has-text("active")');
  });

  await step('a peer that gets busy hands its processes over: the timeline shows them migrated', async () => {
    // A fourth peer with an idle file of its own.
    const idle = path.join(tmp, 'extra-idle');
    fs.writeFileSync(idle, '1.0\n');
    // Enrolled with the token `bspweb up` keeps for its local peers.
    const token = fs.readFileSync(path.join(dataDir, 'local-peers.token'), 'utf8').trim();
    // Its compile cache in the test's directory, not the machine's ~/.cache.
    extraPeer = spawn(BIN, ['peer', '--supernode', base, '--listen', '127.0.0.1:0', '--name', 'extra', '--idle-file', idle,
      '--compile-cache', path.join(tmp, 'extra-compiled')], {
      stdio: ['ignore', 'ignore', 'ignore'],
      env: { ...process.env, BSPWEB_PEER_TOKEN: token },
    });
    const online = async () => (await apiGet('/peers')).body.find((p) => p.name === 'extra' && p.state === 'online');
    const deadline = Date.now() + JOB_MS;
    let extra;
    while (!(extra = await online())) {
      check(Date.now() < deadline, 'the extra peer did not come online');
      await delay(200);
    }
    // A job with a process on it (placement is by hash; a few tries suffice).
    let job = null;
    for (let i = 0; i < 6 && !job; i++) {
      const j = await submitJob({ program: 'supersteps', nprocs: 8, args: { k: 100000000, h: 64 }, description: 'migration test' });
      let info;
      const until = Date.now() + JOB_MS;
      while ((info = (await apiGet(`/jobs/${j.id}`)).body).state === 'waiting') {
        check(Date.now() < until, `job ${j.id} did not start`);
        await delay(200);
      }
      if (info.placement.includes(extra.id)) job = info;
      else await apiPost(`/jobs/${j.id}/kill`, {});
    }
    check(job, 'six jobs of 8 processes placed none on the extra peer');
    const moved = job.placement.map((peer, pid) => (peer === extra.id ? pid : null)).filter((p) => p !== null);
    await page.goto(`${base}/#/jobs/${job.id}`);
    await page.waitForSelector('#job-state:has-text("active")');
    // The extra peer gets busy: the supernode moves its processes away.
    fs.writeFileSync(idle, '0\n');
    log(`  the extra peer (#${extra.id}) hosts pids ${moved.join(', ')}; it reports idle 0 now`);
    await page.waitForFunction(
      (pid) => [...document.querySelectorAll('#timeline li')].some((li) => new RegExp(`^.*pid ${pid} migrated from .+ to .+ after superstep \\d+`).test(li.textContent)),
      moved[0],
      { timeout: JOB_MS },
    );
    await shot('job-migrated');
    await apiPost(`/jobs/${job.id}/kill`, {});
    const exited = new Promise((resolve) => extraPeer.once('exit', resolve));
    extraPeer.kill('SIGKILL');
    await exited;
  });

  await step('kill the long job from its page; only job-level changes are announced', async () => {
    await page.goto(`${base}/#/jobs/${longJob}`);
    await page.waitForSelector('#job-state:has-text("active")');
    // One polite status region for job-level news; the output log, the
    // timeline and the image's row counter do not speak every change.
    const live = await page.evaluate(() =>
      [...document.querySelectorAll('main [aria-live], main [role=status], main [role=alert], main [role=log]')].map((el) => ({
        id: el.id,
        role: el.getAttribute('role'),
        live: el.getAttribute('aria-live'),
      })),
    );
    const speaking = live.filter((r) => r.live !== 'off' && (r.live || ['status', 'alert', 'log'].includes(r.role)));
    check(JSON.stringify(speaking.map((r) => r.id)) === '["job-announce"]', `the job page has other live regions than #job-announce: ${JSON.stringify(live)}`);
    check(live.some((r) => r.id === 'output' && r.role === 'log' && r.live === 'off'), `the output is not a silent role=log: ${JSON.stringify(live)}`);
    await page.click('#kill-job');
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
    check(/killed/.test(await text('#timeline li.terminal')), `the timeline does not say killed: ${await text('#timeline li.terminal')}`);
    await page.waitForSelector('#job-state:has-text("finished: killed")');
    await page.waitForFunction(() => /killed/.test(document.querySelector('#job-announce')?.textContent ?? ''));
    await page.click('#nav a[href="#/jobs"]');
    await page.waitForSelector(`#jobs-finished tr[data-job="${longJob}"]`);
  });

  await step('mandelbrot: raw rows drawn on a canvas as they arrive, nothing lost or doubled across dropped streams', async () => {
    await page.goto(`${base}/#/submit?program=mandelbrot`);
    await page.waitForSelector('#submit-program option[value="mandelbrot"]', { state: 'attached' });
    await page.fill('#submit-nprocs', '4');
    // max_iter spreads the rows over several seconds (about 0.5 s with the default).
    await page.fill('#submit-args', '{"width": 256, "height": 192, "max_iter": 50000}');
    await page.click('#submit-button');
    await page.waitForURL(/#\/jobs\/\d+$/);
    await page.waitForSelector('#image-section:visible');
    // The picture grows while the job runs: the row counter and the rows
    // painted on the canvas (grey; the empty canvas is dark blue) agree, and
    // both increase between two samples taken before the last row.
    const sample = () =>
      page.evaluate(() => {
        const rows = Number(/^(\d+) of/.exec(document.querySelector('#image-status')?.textContent ?? '')?.[1] ?? 0);
        const c = document.querySelector('#raw-canvas');
        const d = c.getContext('2d').getImageData(0, 0, 1, c.height).data;
        let painted = 0;
        for (let y = 0; y < c.height; y++) if (d[4 * y] === d[4 * y + 1] && d[4 * y + 1] === d[4 * y + 2]) painted++;
        return { rows, painted, height: c.height };
      });
    await page.waitForFunction(() => /^[1-9]\d* of/.test(document.querySelector('#image-status')?.textContent ?? ''), null, { timeout: JOB_MS });
    const first = await sample();
    check(first.rows < first.height, `all ${first.rows} rows appeared at once; expected them to arrive a few at a time`);
    check(first.painted === first.rows, `the canvas has ${first.painted} rows painted but the counter says ${first.rows}`);
    await page.waitForFunction((n) => Number(/^(\d+) of/.exec(document.querySelector('#image-status')?.textContent ?? '')?.[1] ?? 0) > n, first.rows, { timeout: JOB_MS });
    const second = await sample();
    check(second.rows > first.rows && second.painted === second.rows, `the picture did not grow as rows arrived: ${JSON.stringify({ first, second })}`);
    log(`  rows drawn: ${first.rows}, then ${second.rows} of ${second.height}`);
    // Drop the streams while rows arrive; the page must resume with Last-Event-ID.
    for (let i = 0; i < 3; i++) {
      await page.waitForFunction(() => /^\d+ of/.test(document.querySelector('#image-status')?.textContent ?? '') || document.querySelector('#timeline li.terminal'), null, { timeout: JOB_MS });
      await page.evaluate(() => window.bspweb.reconnectStreams());
      await page.waitForFunction(() => document.querySelector('#stream-status')?.textContent !== 'Connecting…');
    }
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
    check(/exited/.test(await text('#timeline li.terminal')), `mandelbrot did not exit: ${await text('#timeline li.terminal')}`);
    await page.waitForSelector('#image-status:has-text("192 of 192 rows drawn")');
    const stdout = await page.$$eval('#output .line.stdout', (ls) => ls.map((l) => l.textContent));
    check(stdout.length === 5, `expected 5 stdout lines (4 × "computed", 1 × "done"), got ${stdout.length}: ${stdout.join(' | ')}`);
    check(stdout.some((l) => l.includes('mandelbrot 256x192 done')), 'the "done" line is missing');
    const ids = await page.$$eval('#output .line', (ls) => ls.map((l) => l.dataset.id));
    check(new Set(ids).size === ids.length, 'an output line is shown twice after reconnects');
    const pixels = await page.evaluate(() => {
      const c = document.querySelector('#raw-canvas');
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      const grey = new Set();
      let bright = 0;
      for (let i = 0; i < d.length; i += 4) {
        grey.add(d[i]);
        if (d[i] > 40) bright++;
      }
      return { w: c.width, h: c.height, distinct: grey.size, bright };
    });
    check(pixels.w === 256 && pixels.h === 192, `the canvas is ${pixels.w}×${pixels.h}, expected 256×192`);
    check(pixels.distinct > 5 && pixels.bright > 100, `the canvas looks blank: ${JSON.stringify(pixels)}`);
    await shot('job-mandelbrot');
  });

  const misbehaveWasm = findGuest('misbehave.wasm');
  await step('timeline: a job that dies on an error shows the cause; an aborted job its reason', async () => {
    // misbehave, the runtime's test program, is not offered to users: upload it.
    await apiPost('/programs?name=misbehave&description=test%20program', fs.readFileSync(misbehaveWasm), 'application/wasm');
    const trap = await submitJob({ program: 'misbehave', nprocs: 3, args: { mode: 'trap', pid: 1 }, description: 'traps' });
    const abort = await submitJob({ program: 'misbehave', nprocs: 3, args: { mode: 'abort', pid: 1 }, description: 'aborts' });

    await page.goto(`${base}/#/jobs/${trap.id}`);
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
    const failed = await terminalText();
    check(/died on an error/.test(failed) && /process 1 failed in superstep 1/.test(failed) && /unreachable/.test(failed), `the timeline does not give the trap as the cause: ${failed}`);
    check((await page.getAttribute('#timeline li.terminal', 'class')).includes('bad'), 'the failure is not marked as bad in the timeline');
    await page.waitForSelector('#job-state:has-text("finished: failed")');
    check(/unreachable/.test(await text('#job-state')) && /pid 1/.test(await text('#job-state')), `the state line lacks the cause: ${await text('#job-state')}`);
    check((await page.locator('#output .line.status', { hasText: 'died on an error' }).count()) === 1, 'the failure is not in the output');
    await shot('job-failed');

    await page.goto(`${base}/#/jobs/${abort.id}`);
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
    const aborted = await terminalText();
    check(/The job aborted: process 1 aborted in superstep 1: deliberate abort/.test(aborted), `the timeline does not give the abort's reason: ${aborted}`);
    await page.waitForSelector('#job-state:has-text("finished: aborted")');
    check(/deliberate abort/.test(await text('#job-state')), `the state line lacks the reason: ${await text('#job-state')}`);
  });

  await step('output: a flood keeps at most the newest 50 000 lines and says where the rest are', async () => {
    // Ends by itself: more than 1 MiB of output fails the job (about 66 000 lines).
    const limits = { superstep_ms: 600_000, memory_mib: 512, output_mib: 1 };
    const job = await submitJob({ program: 'misbehave', nprocs: 1, args: { mode: 'flood', pid: null }, limits, description: 'floods' });
    await page.goto(`${base}/#/jobs/${job.id}`);
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
    const failed = await terminalText();
    check(/died on an error/.test(failed) && /output limit exceeded/.test(failed), `the flood did not end on the output limit: ${failed}`);
    // The terminal line is the last one, flushed with the final count.
    await page.waitForFunction(() => /died on an error/.test(document.querySelector('#output .line:last-child')?.textContent ?? ''), null, { timeout: JOB_MS });
    const events = await jobEvents(job.id);
    const expected = events.filter((e) => ['stdout', 'stderr', 'status'].includes(e.kind)).length + 1; // + the terminal line
    check(expected > 55_000, `the flood printed only ${expected} lines; the test needs more than 55 000`);
    const count = await text('#output-count');
    const kept = Number(/(\d+) lines?/.exec(count)?.[1]);
    const note = await text('#output-dropped');
    const dropped = Number(/The oldest (\d+) lines/.exec(note)?.[1]);
    check(kept <= 50_000 && kept >= 40_000, `the page keeps ${kept} lines ("${count}"), expected at most 50 000`);
    check(kept + dropped === expected, `kept ${kept} + dropped ${dropped} lines ≠ the ${expected} lines of the job ("${note}")`);
    check(note.includes(`bspweb logs ${job.id}`) && note.includes(`/api/v1/jobs/${job.id}/events`), `the note does not say where all lines are: ${note}`);
    check((await page.locator('#output-dropped a[href^="/api/docs"]').count()) === 1, 'the note has no link to the REST API documentation');
    check((await page.locator('#output .line').count()) <= 5000, 'more than 5000 lines are in the page');
    const lastStdout = await page.locator('#output .line.stdout').last().innerText();
    const lastSent = events.filter((e) => e.kind === 'stdout').at(-1).text;
    check(lastStdout.endsWith(lastSent), `the newest line shown is "${lastStdout}", the job's last is "${lastSent}"`);
    await shot('job-flood');
  });

  await step('"Submit again" keeps arguments and description with & = + % and non-ASCII intact', async () => {
    const args = { mode: 'x&y=1+2 %41%2B 100% ünïcødé ✓ 𝄞', pid: null };
    const description = 'Tom & Jerry: a=b+c, 100% sure; %2F ünï ✓';
    await page.goto(`${base}/#/submit?program=misbehave`);
    await page.waitForSelector('#submit-program option[value="misbehave"]', { state: 'attached' });
    await page.fill('#submit-nprocs', '1');
    await page.fill('#submit-args', JSON.stringify(args));
    await page.fill('#submit-description', description);
    await page.click('#submit-button');
    await page.waitForURL(/#\/jobs\/\d+$/);
    const firstId = jobIdFromUrl();
    // An unknown mode: the program refuses it, and the cause quotes it verbatim.
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
    check((await terminalText()).includes(`unknown mode \`${args.mode}\``), `the cause does not quote the mode: ${await terminalText()}`);
    await page.click('a:has-text("Submit again")');
    await page.waitForSelector('h1:has-text("Submit a job")');
    await page.waitForSelector('#submit-program option[value="misbehave"]', { state: 'attached' });
    check((await page.inputValue('#submit-program')) === 'misbehave', `Submit again chose ${await page.inputValue('#submit-program')}`);
    check((await page.inputValue('#submit-nprocs')) === '1', `Submit again set ${await page.inputValue('#submit-nprocs')} processes`);
    const argsText = await page.inputValue('#submit-args');
    let again = null;
    try {
      again = JSON.parse(argsText);
    } catch {
      // reported below
    }
    check(JSON.stringify(again) === JSON.stringify(args), `Submit again changed the arguments: ${argsText}`);
    check((await page.inputValue('#submit-description')) === description, `Submit again changed the description: ${await page.inputValue('#submit-description')}`);
    await page.click('#submit-button');
    await page.waitForURL((url) => /#\/jobs\/\d+$/.test(url.hash) && !url.hash.endsWith(`/${firstId}`));
    const second = (await apiGet(`/jobs/${jobIdFromUrl()}`)).body;
    check(JSON.stringify(second.args) === JSON.stringify(args) && second.description === description, `the resubmitted job differs: ${JSON.stringify({ args: second.args, description: second.description })}`);
  });

  await step('submit with "Validate results": two copies asked for; one volunteer\'s peers make it wait, and it says why', async () => {
    await page.goto(`${base}/#/submit?program=ring`);
    await page.waitForSelector('#submit-program option[value="ring"]', { state: 'attached' });
    await page.fill('#submit-nprocs', '2');
    await page.click('details.advanced summary');
    await page.check('#submit-redundancy');
    await page.click('#submit-button');
    await page.waitForURL(/#\/jobs\/\d+$/);
    const id = jobIdFromUrl();
    const job = (await apiGet(`/jobs/${id}`)).body;
    check(job.limits?.redundancy === 2, `the job does not ask for two copies: ${JSON.stringify(job.limits)}`);
    // `bspweb up`'s peers all belong to one volunteer.
    await page.waitForSelector('#timeline li:has-text("waiting for volunteers")', { timeout: JOB_MS });
    await apiPost(`/jobs/${id}/kill`, {});
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
  });

  await step('a malformed link shows an error page, not a blank one', async () => {
    for (const hash of ['#/jobs/%', '#/jobs/%E0%A4%A']) {
      await page.goto(`${base}/${hash}`);
      await page.waitForSelector('main h1:has-text("Page not found")');
      check(/is malformed/.test(await text('#bad-link')), `no clear message for ${hash}: ${await text('main')}`);
      check((await page.locator('#bad-link a[href="#/jobs"]').count()) === 1, `the error page for ${hash} has no way back`);
    }
    await page.goto(`${base}/#/no-such-page`);
    await page.waitForSelector('main h1:has-text("Page not found")');
    await page.click('main a[href="#/jobs"]');
    await page.waitForSelector('h1:has-text("Jobs")');
  });

  await step('raw records that are pictures are shown as images (PNG made here), their URLs revoked on leaving', async () => {
    const png = pngImage(16, 12);
    await apiPost('/programs?name=picture', rawWriterWasm([png, Buffer.from('not a picture')]), 'application/wasm');
    const job = await submitJob({ program: 'picture', nprocs: 2, args: null });
    await page.goto(`${base}/#/jobs/${job.id}`);
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
    check(/exited/.test(await terminalText()), `the picture job did not exit: ${await terminalText()}`);
    await page.waitForFunction(() => document.querySelectorAll('#pictures img').length === 2);
    await page.waitForFunction(() => [...document.querySelectorAll('#pictures img')].every((i) => i.complete && i.naturalWidth > 0));
    const imgs = await page.$$eval('#pictures img', (is) => is.map((i) => ({ src: i.src, alt: i.alt, w: i.naturalWidth, h: i.naturalHeight, pid: i.dataset.pid })));
    for (const i of imgs) {
      check(i.w === 16 && i.h === 12, `a picture is ${i.w}×${i.h}, expected 16×12`);
      check(i.src.startsWith('blob:'), `a picture is not a blob URL: ${i.src}`);
      check(/^PNG picture written by pid [01] \(raw record 1\)$/.test(i.alt), `a picture's alt text is "${i.alt}"`);
    }
    check(new Set(imgs.map((i) => i.pid)).size === 2, `the pictures are not one per pid: ${JSON.stringify(imgs)}`);
    // The other record is not a picture; the raw table still lists both per pid.
    await page.waitForSelector('#raw-section:visible');
    const records = await page.$$eval('#raw-section tbody tr', (rs) => rs.map((r) => r.children[1].textContent));
    check(JSON.stringify(records) === '["2","2"]', `the raw table lists records ${JSON.stringify(records)}, expected 2 per pid`);
    await shot('job-pictures');
    const loads = (src) =>
      page.evaluate(
        (u) =>
          new Promise((resolve) => {
            const i = new Image();
            i.onload = () => resolve(true);
            i.onerror = () => resolve(false);
            i.src = u;
          }),
        src,
      );
    check(await loads(imgs[0].src), 'a picture URL does not load while its page is open');
    await page.click('#nav a[href="#/jobs"]');
    await page.waitForSelector('h1:has-text("Jobs")');
    check(!(await loads(imgs[0].src)), 'a picture URL still loads after leaving its page (not revoked)');
  });

  await step('the REST API page renders under its Content-Security-Policy; the violation detector works', async () => {
    await page.goto(`${base}/api/docs`);
    await page.waitForSelector('h1:has-text("bspweb REST API")');
    await page.waitForFunction(() => document.querySelectorAll('details.op').length > 5);
    check((await page.locator('#tag-jobs').count()) === 1, 'the REST API page has no jobs section (the job page links to it)');
    await shot('api-docs');
    // Back in the app (the session survives in sessionStorage), provoke a
    // violation on purpose: the detector must see it.
    await page.goto(`${base}/#/jobs`);
    await page.waitForSelector('h1:has-text("Jobs")');
    cspSelfTest = [];
    try {
      await page.evaluate(() => document.querySelector('main').setAttribute('style', 'outline: 1px solid red'));
      const deadline = Date.now() + UI_MS;
      while (cspSelfTest.length === 0 && Date.now() < deadline) await delay(50);
      check(cspSelfTest.length > 0 && /style-src/.test(cspSelfTest[0]), `an inline style attribute was not reported as a CSP violation: ${JSON.stringify(cspSelfTest)}`);
    } finally {
      await page.evaluate(() => document.querySelector('main').removeAttribute('style')).catch(() => {});
      cspSelfTest = null;
    }
  });

  await step('narrow (phone) screen: no sideways scrolling', async () => {
    const noSideways = async (p, what, name) => {
      const over = await p.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      check(over <= 1, `${what} scrolls sideways by ${over}px on a 390px screen`);
      await p.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
    };
    await page.setViewportSize({ width: 390, height: 844 });
    for (const [hash, name, ready] of [
      ['#/jobs', 'phone-jobs', 'main table tbody tr'],
      [`#/jobs/${ringJob}`, 'phone-job', '#timeline li.terminal'],
      ['#/peers', 'phone-peers', '#peers tbody tr'],
      ['#/programs', 'phone-programs', '#programs tbody tr'],
      ['#/submit?program=ring', 'phone-submit', '#submit-program option[value="ring"]'],
    ]) {
      await page.goto(`${base}/${hash}`);
      await page.waitForSelector('main h1');
      await page.waitForSelector(ready, { state: 'attached', timeout: JOB_MS });
      await noSideways(page, hash, name);
    }
    await page.setViewportSize({ width: 1280, height: 900 });
    // The sign-in page, in a new tab: its sessionStorage holds no session.
    const tab = await context.newPage();
    watch(tab);
    try {
      await tab.setViewportSize({ width: 390, height: 844 });
      await tab.goto(`${base}/#/jobs`);
      await tab.waitForSelector('h1:has-text("Sign in")');
      await noSideways(tab, 'the sign-in page', 'phone-signin');
    } finally {
      await tab.close();
    }
  });

  await step('dispose a finished job', async () => {
    await page.goto(`${base}/#/jobs`);
    await page.click(`#jobs-finished tr[data-job="${ringJob}"] button:has-text("Delete")`);
    await page.locator(`#jobs-finished tr[data-job="${ringJob}"]`).waitFor({ state: 'detached' });
    check((await apiGet(`/jobs/${ringJob}`)).status === 404, 'the disposed job still exists');
  });

  await step('keyboard: focus is visible on the navigation', async () => {
    // A fresh document, so sequential focus starts at the top of the page and not
    // where the previous step's removed row was (live updates re-render there).
    await page.goto(`${base}/#/jobs`);
    await page.reload();
    await page.waitForSelector('h1:has-text("Jobs")');
    let onNav = false;
    for (let i = 0; i < 6 && !onNav; i++) {
      await page.keyboard.press('Tab');
      onNav = await page.evaluate(() => !!document.activeElement?.closest('#nav'));
    }
    check(onNav, 'Tab never reached the main navigation');
    const outline = await page.evaluate(() => {
      const el = document.activeElement;
      const st = getComputedStyle(el);
      return { tag: el.tagName, style: st.outlineStyle, width: parseFloat(st.outlineWidth) };
    });
    check(outline.style !== 'none' && outline.width >= 2, `the focused ${outline.tag} has no visible outline: ${JSON.stringify(outline)}`);
  });

  await step('a rejected token sends the user back to sign in; sign out', async () => {
    await page.evaluate(() => {
      const s = JSON.parse(sessionStorage.getItem('bspweb.session'));
      s.token = 'not-a-valid-token';
      sessionStorage.setItem('bspweb.session', JSON.stringify(s));
    });
    await page.goto(`${base}/#/programs`);
    await page.reload();
    await page.waitForSelector('h1:has-text("Sign in")');
    await page.fill('#signin-name', 'admin');
    await page.fill('#signin-password', PASSWORD);
    await page.click('form button[type=submit]');
    await page.waitForSelector('h1:has-text("Programs")'); // back where the user was
    await page.click('#sign-out');
    await page.waitForSelector('h1:has-text("Sign in")');
    check((await page.evaluate(() => sessionStorage.getItem('bspweb.session'))) === null, 'signing out kept the token');
  });

  await step("another user sees none of admin's jobs", async () => {
    const res = await fetch(`${base}/api/v1/users`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ name: 'bob', password: `${PASSWORD}-bob` }),
    });
    check(res.ok, `creating the user bob failed: ${res.status} ${await res.text()}`);
    await page.fill('#signin-name', 'bob');
    await page.fill('#signin-password', `${PASSWORD}-bob`);
    await page.click('form button[type=submit]');
    await page.waitForSelector('#account-name:has-text("bob")');
    await page.goto(`${base}/#/jobs`);
    await page.waitForSelector('#jobs-finished', { state: 'attached' });
    await page.waitForFunction(() => document.querySelector('[data-state="finished"] .count')?.textContent === '(0)');
    check((await page.locator('table.jobs tbody tr').count()) === 0, "bob sees admin's jobs");
    await page.goto(`${base}/#/jobs/${longJob}`);
    await page.waitForSelector('#alert:visible');
    check(/no job/i.test(await text('#alert-text')), `bob opening admin's job gets no clear message: ${await text('#alert-text')}`);
    await page.click('#sign-out');
    await page.waitForSelector('h1:has-text("Sign in")');
  });

  const signIn = async (name, password) => {
    await page.fill('#signin-name', name);
    await page.fill('#signin-password', password);
    await page.click('form button[type=submit]');
  };

  await step('users: an administrator creates, edits and disables accounts', async () => {
    await signIn('admin', PASSWORD);
    await page.waitForSelector('#account-name:has-text("admin")');
    await page.waitForSelector('#nav-users:visible');
    await page.click('#nav a[href="#/users"]');
    await page.waitForSelector('h1:has-text("Users")');
    await page.locator('#users tr[data-user="bob"]').waitFor();
    check(/\(you\)/.test(await page.locator('#users tr[data-user="admin"]').innerText()), 'the own account is not marked');
    check((await page.locator('#users tr[data-user="admin"] button:has-text("Disable")').count()) === 0, 'an administrator is offered to disable themselves');
    // A bad name is caught before it is sent.
    await page.fill('#new-user-name', 'bad name');
    await page.fill('#new-user-password', `${PASSWORD}-carol`);
    await page.click('#new-user-button');
    await page.waitForSelector('#new-user-error:visible');
    check(/letters, digits/.test(await text('#new-user-error')), `no clear message for a bad name: ${await text('#new-user-error')}`);
    await page.fill('#new-user-name', 'carol');
    await page.selectOption('#new-user-role', 'volunteer');
    await page.click('#new-user-button');
    const carol = page.locator('#users tr[data-user="carol"]');
    await carol.waitFor();
    check(/Volunteer/.test(await carol.innerText()), `carol is not a volunteer: ${await carol.innerText()}`);
    await carol.locator('button:has-text("Edit")').click();
    await page.waitForSelector('#edit-user:visible');
    await page.fill('#edit-max-processes', '3');
    await page.click('#edit-save');
    await page.waitForFunction(() => /of 3/.test(document.querySelector('#users tr[data-user="carol"]')?.innerText ?? ''));
    await shot('users');
    await page.locator('#users tr[data-user="bob"] button:has-text("Disable")').click();
    await page.waitForFunction(() => /disabled/.test(document.querySelector('#users tr[data-user="bob"]')?.innerText ?? ''));
    await page.click('#sign-out');
    await page.waitForSelector('h1:has-text("Sign in")');
  });

  await step('account: a disabled user cannot sign in; a volunteer changes their password', async () => {
    await signIn('bob', `${PASSWORD}-bob`);
    await page.waitForSelector('.form-error:visible');
    check(/disabled/.test(await text('.form-error')), `bob is not told his account is disabled: ${await text('.form-error')}`);
    await signIn('carol', `${PASSWORD}-carol`);
    await page.waitForSelector('#account-name:has-text("carol")');
    check(!(await page.locator('#nav-users').isVisible()), 'a volunteer sees the Users page link');
    check(!(await page.locator('#nav a[href="#/submit"]').isVisible()), 'a volunteer, who runs no jobs, sees the Submit link');
    await page.click('#nav a[href="#/account"]');
    await page.waitForSelector('h1:has-text("Your account")');
    await page.waitForSelector('#account-facts:has-text("Volunteer")');
    check(/0 of 3/.test(await text('#account-facts')), `the quota is not shown: ${await text('#account-facts')}`);
    // A wrong current password is the form's error; the session stays.
    await page.fill('#pw-current', 'not my password');
    await page.fill('#pw-new', `${PASSWORD}-carol2`);
    await page.fill('#pw-again', `${PASSWORD}-carol2`);
    await page.click('#pw-button');
    await page.waitForSelector('#pw-error:visible');
    check(/current password is wrong/.test(await text('#pw-error')), `no clear message: ${await text('#pw-error')}`);
    check(await page.locator('h1:has-text("Your account")').isVisible(), 'a wrong password signed the user out');
    await page.fill('#pw-again', 'something else');
    await page.click('#pw-button');
    await page.waitForFunction(() => /differ/.test(document.querySelector('#pw-error')?.textContent ?? ''));
    await page.fill('#pw-current', `${PASSWORD}-carol`);
    await page.fill('#pw-again', `${PASSWORD}-carol2`);
    await page.click('#pw-button');
    await page.waitForSelector('#notice:has-text("Password changed")');
    await shot('account');
    // Still signed in with the fresh token.
    await page.click('#nav a[href="#/jobs"]');
    await page.waitForSelector('h1:has-text("Jobs")');
    await page.click('#sign-out');
    await signIn('carol', `${PASSWORD}-carol2`);
    await page.waitForSelector('#account-name:has-text("carol")');
    await page.click('#sign-out');
    await page.waitForSelector('h1:has-text("Sign in")');
  });

  await step('every kind of page was checked for unlabelled fields', async () => {
    const checked = [...fieldChecks.keys()];
    for (const [kind, re] of [
      ['sign-in', /\(Sign in\)$/],
      ['jobs', /#\/jobs \(Jobs\)$/],
      ['job', /#\/jobs\/\d+ \(Job \d+/],
      ['submit', /#\/submit.* \(Submit a job\)$/],
      ['programs', /#\/programs \(Programs\)$/],
      ['peers', /#\/peers \(Peers\)$/],
      ['account', /#\/account \(Your account\)$/],
      ['users', /#\/users \(Users\)$/],
    ]) {
      check(checked.some((k) => re.test(k)), `no ${kind} page was checked for unlabelled fields; checked: ${checked.join(' | ')}`);
    }
    log(`  ${checked.length} page states checked for unlabelled fields`);
  });

  check(foreign.length === 0, `the UI tried to fetch from elsewhere: ${foreign.join(', ')}`);
  check(jsErrors.length === 0, `JavaScript errors in the page:\n  ${jsErrors.join('\n  ')}`);
  check(cspViolations.length === 0, `Content-Security-Policy violations:\n  ${cspViolations.join('\n  ')}`);
  if (lateFailure) throw lateFailure;
}

let failed = false;
try {
  await main();
  log(`all browser tests passed; screenshots in ${path.relative(process.cwd(), SHOTS) || SHOTS}`);
} catch (e) {
  failed = true;
  if (interrupted) {
    await cleanup();
    process.exit(130);
  }
  console.error(`\nbrowser test FAILED in step "${currentStep}":\n  ${e instanceof StepFailure ? e.message : e.stack || e}`);
  try {
    const page = context?.pages()[0];
    if (page) {
      await page.screenshot({ path: path.join(SHOTS, 'failure.png'), fullPage: true });
      console.error(`  page: ${page.url()}; screenshot: target/screenshots/failure.png`);
      const alert = await page.locator('#alert-text').innerText().catch(() => '');
      if (alert) console.error(`  the page's alert says: ${alert}`);
    }
  } catch {
    // no screenshot
  }
  if (serverOut.trim()) console.error(`  last output of bspweb up:\n${serverOut.trim().split('\n').slice(-30).map((l) => `    ${l}`).join('\n')}`);
} finally {
  await cleanup();
}
process.exit(failed ? 1 : 0);
