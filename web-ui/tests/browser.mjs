// Browser test of the bspweb web UI.
//
// Starts the real product (`target/release/bspweb up --peers 3` on a free
// port with a fresh data directory), waits for its peers, and drives Debian's
// Chromium through playwright-core: sign in, upload programs (a good one and a
// bad one), submit jobs and watch their output stream, kill a long job, see a
// mandelbrot drawn on a canvas across forced stream reconnects, and look at
// the peers and the DHHT ring. Screenshots go to target/screenshots/.
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
import { chromium } from 'playwright-core';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '..', '..');
const BIN = process.env.BSPWEB_BIN || path.join(ROOT, 'target', 'release', 'bspweb');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SHOTS = path.join(ROOT, 'target', 'screenshots');
const GUESTS = path.join(ROOT, 'target', 'guests');
const PASSWORD = `browser-test-${process.pid}-${Date.now()}`;
const PEERS = 3;
const EXAMPLES = ['ring', 'mandelbrot', 'inner-product', 'sample-sort', 'broadcast', 'supersteps'];

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
async function step(name, fn) {
  currentStep = name;
  const t0 = Date.now();
  log(`▶ ${name}`);
  await fn();
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
  server = spawn(BIN, ['up', '--listen', `127.0.0.1:${port}`, '--data', data, '--peers', String(PEERS), '--idle-file', idle], {
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
  await step(`start bspweb up with ${PEERS} peers`, async () => {
    ({ base } = await startServer());
    log(`supernode at ${base}`);
  });
  const token = await apiToken(base);
  const apiGet = async (p) => {
    const res = await fetch(`${base}/api/v1${p}`, { headers: { Authorization: `Bearer ${token}` } });
    return { status: res.status, body: res.headers.get('content-type')?.includes('json') ? await res.json() : await res.text() };
  };
  // The features the lead engineer adds in parallel; absent ones are reported, and fail the test.
  const ringAvailable = (await apiGet('/ring')).status === 200;

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
  const page = context.pages()[0] || (await context.newPage());
  const jsErrors = [];
  page.on('pageerror', (e) => jsErrors.push(`uncaught: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) jsErrors.push(`console: ${m.text()}`);
  });
  page.on('dialog', (d) => d.accept().catch(() => {}));
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
  const unlabelled = () =>
    page.evaluate(() =>
      [...document.querySelectorAll('main input, main select, main textarea')]
        .filter((el) => el.type !== 'hidden' && !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.getAttribute('aria-labelledby'))
        .map((el) => el.id || el.name || el.outerHTML.slice(0, 60)),
    );

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
    check((await unlabelled()).length === 0, `form fields without labels: ${await unlabelled()}`);
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
      const res = await route.fetch();
      const events = (await res.text()).split('\n\n').filter((e) => e.trim());
      check(events.length > 8, `the ring job's stream has only ${events.length} events`);
      const keep = 6;
      cutAfter = /^id: ?(\d+)$/m.exec(events[keep - 1])?.[1];
      check(cutAfter, `no id line in the event ${events[keep - 1]}`);
      // Six whole events, then half of the seventh: the page must not show the half.
      const body = `${events.slice(0, keep).join('\n\n')}\n\n${events[keep].slice(0, Math.floor(events[keep].length / 2))}`;
      await route.fulfill({ status: 200, headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' }, body });
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

  await step('peers page: peers with lease, speed, idle, state, processes; the ring SVG', async () => {
    await page.click('#nav a[href="#/peers"]');
    await page.waitForSelector('h1:has-text("Peers")');
    await page.waitForFunction((n) => document.querySelectorAll('#peers tr[data-state="online"]').length >= n, PEERS);
    const first = await page.locator('#peers tbody tr').first().innerText();
    check(/online/.test(first) && /in \d/.test(first) && /%/.test(first), `a peer row lacks state, lease expiry or idle: ${first}`);
    const hosted = await page.$$eval('#peers tbody tr', (rs) => rs.reduce((n, r) => n + Number(r.children[6].textContent), 0));
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

  await step('kill the long job from its page', async () => {
    await page.goto(`${base}/#/jobs/${longJob}`);
    await page.click('#kill-job');
    await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
    check(/killed/.test(await text('#timeline li.terminal')), `the timeline does not say killed: ${await text('#timeline li.terminal')}`);
    await page.waitForSelector('#job-state:has-text("finished: killed")');
    await page.click('#nav a[href="#/jobs"]');
    await page.waitForSelector(`#jobs-finished tr[data-job="${longJob}"]`);
  });

  await step('mandelbrot: raw rows drawn on a canvas as they arrive, nothing lost or doubled across dropped streams', async () => {
    await page.goto(`${base}/#/submit?program=mandelbrot`);
    await page.waitForSelector('#submit-program option[value="mandelbrot"]', { state: 'attached' });
    await page.fill('#submit-nprocs', '4');
    await page.fill('#submit-args', '{"width": 256, "height": 192}');
    await page.click('#submit-button');
    await page.waitForURL(/#\/jobs\/\d+$/);
    await page.waitForSelector('#image-section:visible');
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

  await step('narrow (phone) screen: no sideways scrolling', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    for (const [hash, name] of [
      ['#/jobs', 'phone-jobs'],
      [`#/jobs/${ringJob}`, 'phone-job'],
      ['#/peers', 'phone-peers'],
    ]) {
      await page.goto(`${base}/${hash}`);
      await page.waitForSelector('main h1');
      await page.waitForSelector('main table tbody tr');
      if (hash.startsWith('#/jobs/')) await page.waitForSelector('#timeline li.terminal', { timeout: JOB_MS });
      const over = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      check(over <= 1, `${hash} scrolls sideways by ${over}px on a 390px screen`);
      await shot(name);
    }
    await page.setViewportSize({ width: 1280, height: 900 });
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

  check(foreign.length === 0, `the UI tried to fetch from elsewhere: ${foreign.join(', ')}`);
  check(jsErrors.length === 0, `JavaScript errors in the page:\n  ${jsErrors.join('\n  ')}`);
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
