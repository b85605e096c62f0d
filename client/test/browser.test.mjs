// End-to-end tests of roost.js in headless Chromium against real roost
// processes: nodes killed, drained and restarted under the pages, reloads
// in the middle (one while the node is down, its outbox full), a
// memory-store restart, and 200 clients reconnecting.
// Run by the repository's `go test` (test/client_test.go), which builds the
// binary and gives each run its own PostgreSQL database:
//   ROOST_BIN=path/to/roost ROOST_DATABASE_URL=postgres://... node --test test/browser.test.mjs
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import crypto from "node:crypto";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const BIN = process.env.ROOST_BIN;
const DB = process.env.ROOST_DATABASE_URL;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const skip = !BIN ? "ROOST_BIN is not set: run through go test (test/client_test.go)" : false;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(what, cond, timeout = 30000) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(20);
  }
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const logDir = fs.mkdtempSync(path.join(os.tmpdir(), "roost-browser-"));

// RoostNode is one `roost serve` process, restartable on the same ports
// (the clients reconnect to the same URL).
class RoostNode {
  constructor(name, args) {
    this.name = name;
    this.args = args;
    this.proc = null;
    this.starts = 0;
  }

  async start() {
    if (!this.port) {
      this.port = await freePort();
      this.admin = await freePort();
    }
    for (let attempt = 0; ; attempt++) {
      const logf = path.join(logDir, `${this.name}-${this.starts++}.log`);
      this.logf = logf;
      const out = fs.openSync(logf, "w");
      const proc = spawn(
        BIN,
        ["serve", ...(this.args.includes("--app-secret") ? [] : ["--insecure"]), "--listen", `127.0.0.1:${this.port}`, "--admin", `127.0.0.1:${this.admin}`,
          "--api", "off", "--log-format", "json", "--loops", "1", "--flush", "1ms", ...this.args],
        { stdio: ["ignore", out, out], env: cleanEnv() },
      );
      fs.closeSync(out);
      this.proc = proc;
      this.exited = new Promise((r) => proc.once("exit", r));
      const ok = await Promise.race([this.ready(15000), this.exited.then(() => false)]);
      if (ok) return;
      const log = fs.readFileSync(logf, "utf8");
      if (/address already in use/.test(log) && attempt < 20) {
        await sleep(100); // the port of the killed process is not free yet
        continue;
      }
      throw new Error(`${this.name} did not start:\n${log}`);
    }
  }

  async ready(timeout) {
    const end = Date.now() + timeout;
    while (Date.now() < end) {
      try {
        const r = await fetch(`http://127.0.0.1:${this.admin}/readyz`);
        if (r.status === 200) return true;
      } catch {
        // not listening yet
      }
      if (this.proc.exitCode !== null) return false;
      await sleep(10);
    }
    throw new Error(`${this.name} not ready within ${timeout} ms`);
  }

  async kill() {
    this.proc.kill("SIGKILL");
    await this.exited;
  }

  async drain() {
    this.proc.kill("SIGTERM");
    const t = setTimeout(() => this.proc.kill("SIGKILL"), 15000);
    const code = await this.exited;
    clearTimeout(t);
    assert.equal(code, 0, `${this.name} drained with exit ${code}`);
  }

  async accepted() {
    const r = await fetch(`http://127.0.0.1:${this.admin}/metrics`);
    const m = /^roost_accepted_total (\d+)/m.exec(await r.text());
    return m ? Number(m[1]) : 0;
  }

  log() {
    try {
      return fs.readFileSync(this.logf, "utf8").split("\n").slice(-40).join("\n");
    } catch {
      return "";
    }
  }
}

// cleanEnv keeps the node's configuration to its flags.
function cleanEnv() {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!k.startsWith("ROOST_") && k !== "DATABASE_URL" && k !== "REDIS_URL") env[k] = v;
  }
  return env;
}

const SECRET = "s3cret-" + Math.random().toString(36).slice(2);
const tokensIssued = [];

function signToken(secret, claims) {
  const enc = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const msg = `${enc({ alg: "HS256", typ: "JWT" })}.${enc(claims)}`;
  return `${msg}.${crypto.createHmac("sha256", secret).update(msg).digest("base64url")}`;
}

// The pages' origin: a static server of e2e.html and roost.js, apart from
// the nodes, so that a page can be reloaded while its node is down.
let site;
let siteURL;
let browser;
const nodes = [];

before(async () => {
  if (skip) return;
  const files = {
    "/e2e.html": [path.join(here, "e2e.html"), "text/html; charset=utf-8"],
    "/roost.js": [path.join(here, "..", "roost.js"), "text/javascript; charset=utf-8"],
    "/blank.html": [null, "text/html; charset=utf-8"],
  };
  site = http.createServer((req, res) => {
    const u = new URL(req.url, "http://x");
    if (u.pathname === "/token") {
      // An app backend's token endpoint: ?sub=&ttl=S&secret=
      tokensIssued.push(u.searchParams.get("sub"));
      const exp = Math.floor(Date.now() / 1000) + Number(u.searchParams.get("ttl"));
      res.writeHead(200, { "Content-Type": "text/plain", "Cache-Control": "no-store" });
      res.end(signToken(u.searchParams.get("secret") || SECRET, { app: "tapp", sub: u.searchParams.get("sub"), exp }));
      return;
    }
    const f = files[u.pathname];
    if (!f) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "Content-Type": f[1], "Cache-Control": "no-store" });
    res.end(f[0] ? fs.readFileSync(f[0]) : "<!doctype html><title>blank</title>");
  });
  await new Promise((r) => site.listen(0, "127.0.0.1", r));
  siteURL = `http://127.0.0.1:${site.address().port}`;
  const { chromium } = await import("playwright-core");
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"],
  });
});

after(async () => {
  for (const n of nodes) if (n.proc && n.proc.exitCode === null) n.proc.kill("SIGKILL");
  if (browser) await browser.close();
  if (site) site.close();
});

function node(name, args) {
  const n = new RoostNode(name, args);
  nodes.push(n);
  return n;
}

// openPage loads e2e.html as user; sync(p) brings p.rec up to date with
// what the page recorded.
async function openPage(ctx, n, user, room, extra = {}) {
  const page = await ctx.newPage();
  const p = { page, user, seen: 0, rec: { msg: [], ack: [], nack: [], pack: [], pnack: [], reset: [], close: [], error: [], state: [], joined: [], loaded: [], open: [], presence: [] } };
  const q = new URLSearchParams({ user, room, node: `ws://127.0.0.1:${extra.port || n.port}/ws`, ...(extra.sse ? { sse: "1" } : {}), ...(extra.presence ? { presence: "1" } : {}) });
  await page.goto(`${siteURL}/e2e.html?${q}`);
  await page.waitForFunction(() => window.room && window.room.joined, null, { timeout: 10000 });
  return p;
}

async function sync(...ps) {
  for (const p of ps) {
    let recs;
    try {
      recs = await p.page.evaluate((from) => window.records(from), p.seen);
    } catch {
      continue; // navigating (a reload): next time
    }
    for (const [kind, data] of recs) (p.rec[kind] ||= []).push(data);
    p.seen += recs.length;
  }
  return true;
}

function checkExactlyOnce(p, total) {
  const seqs = p.rec.msg.map((m) => m.seq);
  const want = Array.from({ length: total }, (_, i) => i + 1);
  if (seqs.length !== total || seqs.some((s, i) => s !== i + 1)) {
    const dups = seqs.filter((s, i) => seqs.indexOf(s) !== i);
    const missing = want.filter((s) => !seqs.includes(s));
    assert.fail(`${p.user} was given ${seqs.length} messages, not 1..${total} in order: duplicates ${dups.slice(0, 10)}, missing ${missing.slice(0, 10)}`);
  }
}

test("two pages exchange 1,000 messages across two kills, a drain and two reloads (one while the node is down): each sees every message once, in order; every publish acked once", { skip: skip || (!DB && "ROOST_DATABASE_URL is not set") }, async (t) => {
  const n = node("pg", ["--database-url", DB, "--migrate", "--drain", "300ms", "--retry-min", "200ms", "--retry-max", "800ms"]);
  await n.start();
  const ctx = await browser.newContext();
  t.after(() => ctx.close());
  const room = "e2e-" + Math.random().toString(36).slice(2, 8);
  const alice = await openPage(ctx, n, "alice", room);
  const bob = await openPage(ctx, n, "bob", room);
  const carol = await openPage(ctx, n, "carol", room); // only listens
  const pages = [alice, bob];
  const acked = () => alice.rec.ack.length + bob.rec.ack.length;
  // The seq alice was last given counts the messages stored.
  const stored = () => alice.page.evaluate(() => window.room.seq || 0);
  // Each disruption waits for both pages to be connected, so that it
  // happens to both.
  const reached = async (k) => {
    if ((await stored()) < k) return false;
    for (const p of pages) if (!(await p.page.evaluate(() => window.client.state === "open" && window.room.joined))) return false;
    return true;
  };
  const events = [];
  const mark = async (what) => events.push(`${what} at seq ${await stored()}`);
  try {
    await alice.page.evaluate(() => window.publishAll(500, 25));
    await bob.page.evaluate(() => window.publishAll(500, 25));

    await until("150 messages stored", () => reached(150));
    await mark("kill");
    await n.kill();
    await sleep(300);
    await n.start();

    await until("400 messages stored", () => reached(400));
    await mark("drain");
    await n.drain();
    await n.start();

    await until("600 messages stored", () => reached(600));
    await mark("reload of bob");
    await bob.page.reload();
    await bob.page.waitForFunction(() => window.room && window.room.joined, null, { timeout: 10000 });

    await until("800 messages stored", () => reached(800));
    await mark("kill, and a reload of bob while the node is down");
    await n.kill();
    await sleep(300); // bob's publishes wait in his outbox
    await bob.page.reload();
    await bob.page.waitForFunction(() => window.client, null, { timeout: 10000 });
    await sleep(100);
    await n.start();

    await until("every publish acked and every message delivered to both pages",
      async () => (await sync(alice, bob, carol)) && acked() >= 1000 && [alice, bob, carol].every((p) => p.rec.msg.length >= 1000), 90000);
    await sleep(500); // anything extra (a duplicate) would arrive now
    await sync(alice, bob, carol);
  } catch (err) {
    err.message += `\nevents: ${events.join(", ")}; acks ${acked()}, alice ${alice.rec.msg.length} msgs, bob ${bob.rec.msg.length} msgs, carol ${carol.rec.msg.length} msgs` +
      `\nnacks ${JSON.stringify([...alice.rec.nack, ...bob.rec.nack].slice(0, 5))}\nnode log:\n${n.log()}`;
    throw err;
  }

  for (const p of [...pages, carol]) {
    checkExactlyOnce(p, 1000);
    assert.deepEqual(p.rec.nack, [], `${p.user}: refused publishes`);
    assert.deepEqual(p.rec.reset, [], `${p.user}: a reset where the node kept every message`);
  }
  // Every publish acknowledged exactly once, the acks naming each seq once,
  // and the message delivered under each seq is the one acknowledged.
  const acks = [...alice.rec.ack, ...bob.rec.ack];
  const byId = new Map();
  for (const a of acks) {
    assert.ok(!byId.has(a.id), `${a.id} acknowledged twice`);
    byId.set(a.id, a.seq);
  }
  assert.equal(byId.size, 1000);
  for (const u of ["alice", "bob"]) for (let i = 0; i < 500; i++) assert.ok(byId.has(`${u}-${i}`), `${u}-${i} never acknowledged`);
  const bySeq = new Map(alice.rec.msg.map((m) => [m.seq, m.id]));
  for (const [id, seq] of byId) assert.equal(bySeq.get(seq), id, `seq ${seq} acknowledged as ${id}, delivered as ${bySeq.get(seq)}`);
  // Each promise settled once, with its ack; alice's page lived throughout,
  // so every one of hers did. bob's publishes unacknowledged at his reload
  // were re-sent by the next page from the stored outbox, without promise.
  for (const p of pages) {
    assert.deepEqual(p.rec.pnack, [], `${p.user}: rejected promises`);
    const packs = new Map();
    for (const a of p.rec.pack) {
      assert.ok(!packs.has(a.id), `${a.id}: its promise settled twice`);
      assert.equal(a.seq, byId.get(a.id), `${a.id}: its promise and its ack disagree`);
      packs.set(a.id, a.seq);
    }
    if (p === alice) assert.equal(packs.size, 500);
  }
  const restored = bob.rec.ack.filter((a) => a.restored).length;
  // The disruptions happened under the pages: drops, a drain with its hint.
  // The drain's 1001 and retry hint reach every page, the publishing ones
  // too: the node reads and drops what they still send until they answer
  // its close, so no reset throws the close frame away.
  const closes = `events: ${events.join(", ")}; closes alice ${alice.rec.close.map((c) => c.code)} bob ${bob.rec.close.map((c) => c.code)} carol ${carol.rec.close.map((c) => c.code)}`;
  for (const p of [...pages, carol]) {
    assert.ok(p.rec.close.some((c) => c.code === 1001 && c.retry !== null), `${p.user} saw no drain close: ${closes}`);
  }
  for (const p of pages) {
    assert.ok(p.rec.close.filter((c) => c.code === 1006 && c.wasOpen).length >= 1, `${p.user} saw no lost connection`);
  }
  assert.equal(bob.rec.loaded.length, 3);
  assert.ok(restored > 0, "bob's reload while the node was down left nothing in his outbox");
  assert.ok(bob.rec.loaded[1].seq > 0 && bob.rec.loaded[1].seq < 1000, `bob reloaded at seq ${bob.rec.loaded[1].seq}: not in the middle of the stream`);
  t.diagnostic(`${closes}; bob reloaded at seq ${bob.rec.loaded[1].seq} and ${bob.rec.loaded[2].seq} (node down), ${restored} of his publishes acked from a restored outbox`);
});

// storedIds reads the room's messages from PostgreSQL itself (psql), or
// null without psql.
function storedIds(app, room) {
  if (!DB) return null;
  const r = spawnSync("psql", [DB, "-At", "-c",
    `SELECT m.seq, m.sender, convert_from(m.idem_key, 'UTF8') FROM messages m JOIN rooms r ON r.id = m.room_id WHERE r.app = '${app}' AND r.name = '${room}' ORDER BY m.seq`], { encoding: "utf8" });
  if (r.error || r.status !== 0) return null;
  return r.stdout.trim().split("\n").filter(Boolean).map((l) => l.split("|"));
}

test("the outbox outlives a reload: publishes made while the node was frozen or down are stored exactly once after the next page re-sends them", { skip: skip || (!DB && "ROOST_DATABASE_URL is not set") }, async (t) => {
  const n = node("outbox", ["--database-url", DB, "--migrate", "--drain", "200ms"]);
  await n.start();
  const ctx = await browser.newContext();
  t.after(() => ctx.close());
  const room = "ob-" + Math.random().toString(36).slice(2, 8);
  const alice = await openPage(ctx, n, "alice", room);
  const outbox = () => alice.page.evaluate(() => window.client.outbox.map((e) => [e.id, e.sent, e.restored]));
  // Frozen: the socket stays up, the publishes go out and no ack comes.
  n.proc.kill("SIGSTOP");
  await alice.page.evaluate(() => { window.publish(0); window.publish(1); });
  assert.deepEqual(await outbox(), [["alice-0", true, false], ["alice-1", true, false]]);
  // Down: the connection drops with those two unanswered; two more wait.
  await n.kill();
  await until("the page sees the node gone", () => alice.page.evaluate(() => window.client.state !== "open"), 10000);
  await alice.page.evaluate(() => { window.publish(2); window.publish(3); });
  assert.deepEqual((await outbox()).map((e) => e[1]), [false, false, false, false]);
  // The reload: no promise survives; the next page restores the outbox.
  await alice.page.reload();
  await alice.page.waitForFunction(() => window.client, null, { timeout: 10000 });
  assert.deepEqual(await outbox(), [0, 1, 2, 3].map((i) => [`alice-${i}`, false, true]));
  await n.start();
  await until("4 acks", async () => (await sync(alice)) && alice.rec.ack.length >= 4, 20000);
  await sleep(500); // a second ack of an id would arrive now
  await sync(alice);
  assert.deepEqual(alice.rec.ack.map((a) => [a.id, a.restored]).sort(), [0, 1, 2, 3].map((i) => [`alice-${i}`, true]));
  assert.deepEqual(alice.rec.pack, [], "no promise of the first page settled");
  assert.deepEqual(alice.rec.nack, []);
  assert.deepEqual(await outbox(), []);
  // The node's history and PostgreSQL hold each once, and the page was
  // given each once.
  const h = await alice.page.evaluate(() => window.room.history({ limit: 100 }));
  assert.deepEqual(h.messages.map((m) => m.id).sort(), ["alice-0", "alice-1", "alice-2", "alice-3"]);
  assert.deepEqual(h.messages.map((m) => m.seq), [1, 2, 3, 4]);
  await until("4 messages delivered", async () => (await sync(alice)) && alice.rec.msg.length >= 4, 10000);
  assert.deepEqual(alice.rec.msg.map((m) => m.seq), [1, 2, 3, 4]);
  const rows = storedIds("e2e", room);
  if (rows === null) t.diagnostic("psql not available: PostgreSQL's rows not read directly");
  else assert.deepEqual(rows.map((r) => r[2]).sort(), ["alice-0", "alice-1", "alice-2", "alice-3"], `PostgreSQL rows ${JSON.stringify(rows)}`);
  assert.deepEqual(await alice.page.evaluate(() => Object.keys(sessionStorage).filter((k) => k.includes("#outbox"))), [], "the stored outbox is empty");
});

// upgradeBlockingProxy forwards plain HTTP to the node on port and refuses
// every WebSocket upgrade, as a proxy that does not pass them would; 502
// while the node is down.
async function upgradeBlockingProxy(port) {
  const srv = http.createServer((req, res) => {
    const up = http.request({ host: "127.0.0.1", port, path: req.url, method: req.method, headers: req.headers, agent: false }, (ur) => {
      res.writeHead(ur.statusCode, ur.headers);
      ur.pipe(res);
      ur.on("aborted", () => res.destroy());
      ur.on("error", () => res.destroy());
    });
    up.on("error", () => {
      if (res.headersSent) res.destroy();
      else res.writeHead(502, { "Access-Control-Allow-Origin": "*", "Content-Type": "text/plain" }).end("bad gateway: the node is down");
    });
    req.pipe(up);
  });
  srv.on("upgrade", (req, sock) => sock.end("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"));
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return srv;
}

test("SSE fallback: a page whose WebSocket is blocked listens over /sse, in order, exactly once, across a kill, a drain and the browser's own reconnects", { skip: skip || (!DB && "ROOST_DATABASE_URL is not set") }, async (t) => {
  // Streams end every second or so (--sse-max-age): the browser's
  // EventSource then reconnects by itself, from its Last-Event-ID. After
  // the kill and the drain (the node down: the proxy's 502 makes the
  // browser give up) the client reopens the stream from its positions.
  const n = node("sse", ["--database-url", DB, "--migrate", "--drain", "200ms", "--retry-min", "200ms", "--retry-max", "600ms", "--sse-max-age", "1s"]);
  await n.start();
  const proxy = await upgradeBlockingProxy(n.port);
  t.after(() => proxy.close());
  const ctx = await browser.newContext();
  t.after(() => ctx.close());
  const room = "sse-" + Math.random().toString(36).slice(2, 8);
  const total = 300;
  const bob = await openPage(ctx, n, "bob", room); // publishes over WebSocket, straight to the node
  const dave = await openPage(ctx, n, "dave", room, { port: proxy.address().port, sse: true }); // behind the proxy
  const transport = () => dave.page.evaluate(() => window.client.transport);
  assert.equal(await transport(), "sse");
  const events = [];
  const reached = async (k) => (await sync(dave)) && dave.rec.msg.length >= k && (await transport()) === "sse" && (await bob.page.evaluate(() => window.client.state === "open"));
  const reopened = () => dave.rec.close.filter((c) => c.reason === "sse failed").length;
  let calm;
  try {
    await bob.page.evaluate((total) => window.publishAll(total, 20), total);
    await until("100 messages over SSE", () => reached(100));
    events.push(`kill at ${dave.rec.msg.length}`);
    await n.kill();
    await sleep(300);
    await n.start();
    await until("200 messages over SSE", () => reached(200));
    events.push(`drain at ${dave.rec.msg.length}`);
    await n.drain();
    await n.start();
    await until("every message over SSE", async () => (await sync(bob, dave)) && bob.rec.ack.length >= total && dave.rec.msg.length >= total, 60000);
    // The node stays up: the next stream ends at its age and the browser
    // resumes it from Last-Event-ID, with no reopening by the client.
    calm = { opens: dave.rec.open.length, reopened: reopened() };
    await until("a stream resumed by the browser", async () => (await sync(dave)) && dave.rec.open.length > calm.opens + 1, 15000);
    assert.equal(reopened(), calm.reopened, "the client reopened a stream while the node was up");
    await bob.page.evaluate((total) => { for (let i = total; i < total + 20; i++) window.publish(i); }, total);
    await until("20 more", async () => (await sync(bob, dave)) && dave.rec.msg.length >= total + 20, 15000);
    await sleep(500);
    await sync(bob, dave);
  } catch (err) {
    err.message += `\nevents: ${events.join(", ")}; dave ${dave.rec.msg.length} msgs, opens ${JSON.stringify(dave.rec.open)}, closes ${JSON.stringify(dave.rec.close)}, errors ${JSON.stringify(dave.rec.error)}\nnode log:\n${n.log()}`;
    throw err;
  }
  checkExactlyOnce(dave, total + 20);
  assert.deepEqual(dave.rec.reset, []);
  assert.ok(dave.rec.open.every((o) => o.transport === "sse"), `dave opened a WebSocket through the proxy: ${JSON.stringify(dave.rec.open)}`);
  t.diagnostic(`events: ${events.join(", ")}; dave's stream opened ${dave.rec.open.length} times: ${reopened()} reopened by the client after the browser gave up (node down), the others resumed by the browser from Last-Event-ID`);
});

test("presence: two pages see each other join; a reload within the grace period does not flap; a page gone is left after it", { skip }, async (t) => {
  const n = node("presence", ["--drain", "200ms"]);
  await n.start();
  const ctx = await browser.newContext();
  t.after(() => ctx.close());
  const room = "pr-" + Math.random().toString(36).slice(2, 8);
  const alice = await openPage(ctx, n, "alice", room, { presence: true });
  const members = (p) => p.page.evaluate(() => window.room.members);
  await until("alice sees herself", async () => (await members(alice)).includes("alice"), 10000);
  const bob = await openPage(ctx, n, "bob", room, { presence: true });
  await until("alice sees bob join", async () => (await members(alice)).includes("bob"), 10000);
  await until("bob sees both", async () => JSON.stringify(await members(bob)) === '["alice","bob"]', 10000);
  const q = await alice.page.evaluate(() => window.room.presence());
  assert.equal(q.count, 2);
  assert.deepEqual([...q.users].sort(), ["alice", "bob"]);
  await sync(alice);
  const before = alice.rec.presence.length;
  assert.ok(alice.rec.presence.some((d) => d.joined.includes("bob")), JSON.stringify(alice.rec.presence));

  // bob reloads: a new connection within the grace period.
  await bob.page.reload();
  await bob.page.waitForFunction(() => window.room && window.room.joined, null, { timeout: 10000 });
  // The reloaded page knows who is here at once, from its snapshot.
  await until("bob's new page sees both", async () => JSON.stringify(await members(bob)) === '["alice","bob"]', 10000);
  await sleep(7000); // past the 5 s grace and the 1 s coalescing
  await sync(alice);
  assert.deepEqual(alice.rec.presence.slice(before), [], "alice was told of bob's reload");
  assert.deepEqual(await members(alice), ["alice", "bob"]);

  // bob goes for good: left after the grace period.
  const gone = Date.now();
  await bob.page.close();
  await until("alice sees bob leave", async () => (await sync(alice)) && alice.rec.presence.some((d) => d.left.includes("bob")), 15000);
  const after = Date.now() - gone;
  assert.deepEqual(await members(alice), ["alice"]);
  assert.ok(after >= 4500, `bob left after ${after} ms, within the grace period`);
  t.diagnostic(`alice's diffs ${JSON.stringify(alice.rec.presence)}; bob's leave told after ${after} ms`);
});

test("a memory-store node restarted under a page: onReset, then the new history", { skip }, async (t) => {
  const n = node("mem", ["--drain", "200ms"]);
  await n.start();
  const ctx = await browser.newContext();
  t.after(() => ctx.close());
  const alice = await openPage(ctx, n, "alice", "reset");
  await alice.page.evaluate(() => window.publishAll(5, 5));
  await until("5 messages", async () => (await sync(alice)) && alice.rec.msg.length === 5 && alice.rec.ack.length === 5);
  const before = alice.rec.joined[0];

  await n.kill();
  await n.start();
  await until("alice reset", async () => (await sync(alice)) && alice.rec.reset.length >= 1, 15000);
  assert.equal(alice.rec.reset[0].since, 5);
  assert.equal(alice.rec.reset[0].room, "reset");
  if (before.epoch === undefined) {
    // A node that does not name its histories holds back seqs up to the
    // client's since (it cannot tell another history from its own): the
    // new messages below would wait for seq 6.
    t.diagnostic("the node sends no epoch: the delivery of the new history after the reset is not checked");
    return;
  }
  // The new history goes on from the reset.
  const bob = await openPage(ctx, n, "bob", "reset");
  await bob.page.evaluate(() => window.publishAll(2, 5));
  await until("alice given the new messages", async () => (await sync(alice)) && alice.rec.msg.length >= 7, 10000);
  await sleep(300);
  await sync(alice);

  assert.equal(alice.rec.reset.length, 1, "onReset exactly once");
  const info = alice.rec.reset[0];
  assert.deepEqual(alice.rec.msg.slice(5).map((m) => m.from), ["bob", "bob"]);
  const after = alice.rec.msg.slice(5).map((m) => m.seq);
  // The node names its histories: recovered:false with the new epoch, and
  // the replay starts at the new history's first message.
  assert.notEqual(info.epoch, before.epoch);
  assert.equal(info.previousEpoch, before.epoch);
  assert.equal(info.from, 1);
  assert.deepEqual(after, [1, 2]);
  t.diagnostic(`reset ${JSON.stringify(info)}; then seqs ${after}`);
});

test("tokens: refreshed on the live connection past the first one's expiry; a refused token or refresh stops the client", { skip }, async (t) => {
  const n = node("tok", ["--app-secret", `tapp=${SECRET}`]);
  await n.start();
  const ctx = await browser.newContext();
  t.after(() => ctx.close());
  const page = await ctx.newPage();
  await page.goto(`${siteURL}/blank.html`);
  const url = `ws://127.0.0.1:${n.port}/ws`;
  await page.evaluate(async (url) => {
    const { Roost } = await import("/roost.js");
    window.make = (name, token) => {
      const c = new Roost(url, { token, storage: null });
      const r = { closes: [], errors: [], plans: [], states: [] };
      c.on("close", (e) => r.closes.push(e));
      c.on("error", (e) => r.errors.push({ code: e.code, message: e.message }));
      c.on("reconnect", (e) => r.plans.push(e));
      c.on("state", (s) => r.states.push(s));
      c.room("t", {});
      window[name] = { c, r };
    };
    let n = 0;
    // good: 8 s tokens, refreshed through the auth op.
    window.make("good", async () => (await fetch("/token?sub=alice&ttl=8")).text());
    // forged: signed with another secret: the node refuses the upgrade.
    window.make("forged", async () => (await fetch("/token?sub=eve&ttl=60&secret=wrong")).text());
    // swapped: the refresh names another user: the node refuses the auth op.
    window.make("swapped", async () => (await fetch(`/token?sub=${n++ === 0 ? "bob" : "mallory"}&ttl=6`)).text());
  }, url);
  const get = (name) => page.evaluate((name) => ({ state: window[name].c.state, error: window[name].c.error && { code: window[name].c.error.code, message: window[name].c.error.message }, ...window[name].r }), name);

  await until("the forged token refused", async () => (await get("forged")).state === "closed", 15000);
  await until("the swapped refresh refused", async () => (await get("swapped")).state === "closed", 20000);
  // Past the good client's first token (8 s), and its second one's too.
  await sleep(Math.max(0, 11000));
  const good = await get("good");
  const published = await page.evaluate(() => window.good.c.rooms.get("t").publish("still here").then((a) => a.seq, (e) => e.code));
  const forged = await get("forged");
  const swapped = await get("swapped");
  t.diagnostic(`tokens issued: ${tokensIssued.join(",")}; good closes ${JSON.stringify(good.closes)}; forged ${JSON.stringify(forged.error)}; swapped ${JSON.stringify(swapped.error)}`);

  assert.equal(good.state, "open");
  assert.deepEqual(good.closes, [], "the refreshed connection was never closed");
  assert.ok(tokensIssued.filter((s) => s === "alice").length >= 2, "the good client refreshed its token");
  assert.equal(published, 1);

  assert.equal(forged.error.code, "unauthorized");
  assert.match(forged.error.message, /401 token signature does not match/);
  assert.deepEqual(forged.plans, [], "a refused token is not retried in a loop");
  assert.equal(tokensIssued.filter((s) => s === "eve").length, 1);

  assert.equal(swapped.error.code, "token_refused");
  assert.match(swapped.error.message, /token is for another user/);
  assert.deepEqual(swapped.plans, []);
});

// reconnectTimes reads the node's log (--log-level debug writes a line
// when a connection opens) until want connections have opened, and returns
// their times in ms since t0.
async function reconnectTimes(n, t0, want, timeout) {
  const end = Date.now() + timeout;
  for (;;) {
    const times = [];
    for (const line of fs.readFileSync(n.logf, "utf8").split("\n")) {
      if (!line.includes('"connection open"')) continue;
      const at = Date.parse(JSON.parse(line).time) - t0;
      if (at >= 0) times.push(at);
    }
    if (times.length >= want || Date.now() > end) return times.sort((a, b) => a - b);
    await sleep(50);
  }
}

// maxInWindow is the most times (sorted) within any span of w ms.
function maxInWindow(times, w) {
  let best = 0;
  for (let i = 0, j = 0; j < times.length; j++) {
    while (times[j] - times[i] > w) i++;
    best = Math.max(best, j - i + 1);
  }
  return best;
}

function spread(times, from, to, buckets) {
  const w = (to - from) / buckets;
  const counts = new Array(buckets).fill(0);
  for (const t of times) counts[Math.min(buckets - 1, Math.max(0, Math.floor((t - from) / w)))]++;
  return counts;
}

test("the backoff spreads 200 clients' reconnects over the retry window", { skip }, async (t) => {
  const N = 200;
  const n = node("spread", ["--drain", "200ms", "--retry-min", "1s", "--retry-max", "3s", "--log-level", "debug"]);
  await n.start();
  // Ten clients a page, a browser context each: Chromium opens one
  // WebSocket to an address at a time per context (about 10 ms apart) and
  // delays a renderer's handshakes by how many are pending, guards against
  // reconnect storms that would otherwise measure the browser rather than
  // the client. Real users have a browser each.
  const perPage = 10;
  const all = [];
  for (let p = 0; p < N / perPage; p++) {
    const ctx = await browser.newContext();
    t.after(() => ctx.close());
    const page = await ctx.newPage();
    all.push(page);
    await page.goto(`${siteURL}/blank.html`);
    await page.evaluate(async ({ url, count, p }) => {
      const { Roost } = await import("/roost.js");
      window.clients = [];
      window.plans = []; // every reconnect a client scheduled: {who, wait, why, at}
      for (let i = 0; i < count; i++) {
        const who = `u${p}-${i}`;
        const c = new Roost(url, { user: who, app: "spread", storage: null });
        c.on("reconnect", (r) => window.plans.push({ who, ...r, at: Date.now() }));
        c.room("spread", {});
        window.clients.push(c);
      }
    }, { url: `ws://127.0.0.1:${n.port}/ws`, count: perPage, p });
  }
  const open = async () => {
    let k = 0;
    for (const p of all) k += await p.evaluate(() => window.clients.filter((c) => c.state === "open" && c.rooms.get("spread").joined).length);
    return k;
  };
  // firstPlans is each client's first scheduled reconnect after t0.
  const firstPlans = async (t0) => {
    const first = new Map();
    for (const p of all) {
      for (const e of await p.evaluate((t0) => window.plans.filter((e) => e.at >= t0), t0)) if (!first.has(e.who)) first.set(e.who, e);
    }
    return [...first.values()];
  };
  await until(`${N} clients open`, async () => (await open()) === N, 30000);

  // A killed node: no close frame, no hint: each client draws its wait
  // from the backoff's first window, [0.5 s, 1 s].
  const tKill = Date.now();
  await n.kill();
  await n.start();
  const upKill = Date.now() - tKill;
  const kill = await reconnectTimes(n, tKill, N, 30000);
  await until(`${N} clients open after the kill`, async () => (await open()) === N, 30000);
  const killPlans = await firstPlans(tKill);

  // A drain: 1001 with retry=MS drawn by the node from [1 s, 3 s); each
  // client waits exactly its hint.
  const tDrain = Date.now();
  await n.drain();
  await n.start();
  const upDrain = Date.now() - tDrain;
  const drain = await reconnectTimes(n, tDrain, N, 30000);
  await until(`${N} clients open after the drain`, async () => (await open()) === N, 30000);
  const drainPlans = await firstPlans(tDrain);

  const waits = killPlans.map((e) => e.wait).sort((a, b) => a - b);
  const hints = drainPlans.map((e) => e.wait).sort((a, b) => a - b);
  const waitBuckets = spread(waits, 500, 1000, 5);
  const hintBuckets = spread(hints, 1000, 3000, 4);
  const pct = (xs, q) => xs[Math.floor((xs.length - 1) * q)];
  t.diagnostic(`after a kill: the clients chose waits of ${waits[0]} to ${waits.at(-1)} ms, per 100 ms from 0.5 s ${waitBuckets}`);
  t.diagnostic(`after a kill (node up again at ${upKill} ms): the node logged them opening from ${kill[0]} to ${kill.at(-1)} ms, 10th to 90th percentile ${pct(kill, 0.1)} to ${pct(kill, 0.9)} ms, at most ${maxInWindow(kill, 50)} in 50 ms`);
  t.diagnostic(`after a drain: hints of ${hints[0]} to ${hints.at(-1)} ms, per 500 ms from 1 s ${hintBuckets}`);
  t.diagnostic(`after a drain (node up again at ${upDrain} ms): the node logged them opening from ${drain[0]} to ${drain.at(-1)} ms, 10th to 90th percentile ${pct(drain, 0.1)} to ${pct(drain, 0.9)} ms, at most ${maxInWindow(drain, 100)} in 100 ms`);

  // What each client chose (exact, whatever the machine's load).
  assert.equal(killPlans.length, N);
  assert.ok(killPlans.every((e) => e.why === "backoff" && e.wait >= 500 && e.wait <= 1000), `kill: waits outside [500, 1000]: ${waits.filter((w) => w < 500 || w > 1000)}`);
  for (const b of waitBuckets) assert.ok(b >= N / 5 / 2 && b <= (N / 5) * 1.6, `kill: the clients' waits are uneven: ${waitBuckets}`);
  assert.equal(drainPlans.length, N);
  assert.ok(drainPlans.every((e) => e.why === "hint" && e.wait >= 1000 && e.wait < 3000), `drain: waits that are not the node's hint`);
  for (const b of hintBuckets) assert.ok(b >= N / 4 / 2 && b <= (N / 4) * 1.6, `drain: the hints are uneven: ${hintBuckets}`);
  // What the node saw (its log's times; timers fire late on a loaded
  // machine, never early): nobody back before the floor, and the drain's
  // reconnects spread over its window rather than in one crowd.
  assert.equal(kill.length, N);
  assert.equal(drain.length, N);
  assert.ok(kill[0] >= 480 || upKill >= 480, `a reconnect ${kill[0]} ms after the kill, before the 0.5 s floor`);
  assert.ok(drain[0] >= 950, `a reconnect ${drain[0]} ms after the drain began, before the 1 s hint floor`);
  assert.ok(pct(drain, 0.9) - pct(drain, 0.1) >= 800, `drain: 80% of the reconnects within ${pct(drain, 0.9) - pct(drain, 0.1)} ms at the node`);
});
