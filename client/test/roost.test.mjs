// Unit tests of roost.js's state machine: the test plays the node through a
// fake WebSocket and EventSource, and owns the clock.
import { test } from "node:test";
import assert from "node:assert/strict";

import { Roost, RoostError, memoryStorage, setErrorReporter } from "../roost.js";
import { FakeClock, fakeWebSocket, fakeEventSource, fakeFetch, storage, seeded, flush, jwt } from "./fakes.mjs";

function setup(opts = {}) {
  const clock = new FakeClock();
  const WS = fakeWebSocket();
  const ES = fakeEventSource();
  const store = opts.storage || storage();
  const fetch = opts.fetch || fakeFetch(() => null);
  const states = [];
  const errors = [];
  const client = new Roost(opts.url || "ws://node.test:8080/ws", {
    user: "alice",
    app: "demo",
    WebSocket: WS,
    EventSource: ES,
    fetch,
    storage: store,
    clock,
    random: opts.random || seeded(1),
    pingInterval: 0, // the fake node does not answer pings; one test turns them on
    ...opts.options,
  });
  client.on("state", (s) => states.push(s));
  client.on("error", (e) => errors.push(e));
  return { clock, WS, ES, store, fetch, client, states, errors };
}

// joinedRoom opens the client's socket and answers the join of room.
async function openWith(env, room, joined) {
  await env.clock.advance(0);
  const ws = env.WS.last();
  ws.open();
  if (room) ws.recv({ op: "joined", room, seq: 0, epoch: "E1", ...joined });
  return ws;
}

function msg(room, seq, extra) {
  return { op: "msg", room, seq, id: `m-${seq}`, from: "bob", ts: 1, body: { n: seq }, ...extra };
}

test("connects with user and app, joins its rooms, and reports the states", async () => {
  const env = setup();
  const room = env.client.room("lobby", {});
  assert.equal(env.client.state, "connecting");
  await env.clock.advance(0);
  const ws = env.WS.last();
  assert.equal(ws.query.get("user"), "alice");
  assert.equal(ws.query.get("app"), "demo");
  ws.open();
  assert.deepEqual(ws.ops("join"), [{ op: "join", room: "lobby" }]);
  assert.equal(env.client.state, "open");
  assert.equal(env.client.transport, "websocket");
  ws.recv({ op: "joined", room: "lobby", seq: 7, epoch: "E1" });
  assert.equal(room.joined, true);
  assert.equal(room.seq, 7);
  env.client.close();
  assert.deepEqual(env.states, ["open", "closed"]);
  assert.equal(ws.clientClosed.code, 1000);
});

test("messages reach onMessage once each, in seq order, and positions are stored", async () => {
  const env = setup();
  const got = [];
  env.client.room("lobby", { onMessage: (m) => got.push(m.seq) });
  const ws = await openWith(env, "lobby", { seq: 3 });
  for (const s of [4, 4, 5, 3, 6]) ws.recv(msg("lobby", s));
  assert.deepEqual(got, [4, 5, 6]);
  const key = [...env.store.m.keys()].find((k) => k.endsWith(":lobby"));
  assert.match(key, /^roost:v1:node\.test:8080\/ws:demo\/alice:lobby$/);
  assert.deepEqual(JSON.parse(env.store.m.get(key)), { s: 6, e: "E1" });
});

test("a new client on the same storage (a page reload) resumes with since and epoch", async () => {
  const store = storage();
  const a = setup({ storage: store });
  a.client.room("lobby", {});
  const ws = await openWith(a, "lobby", { seq: 10, epoch: "E9" });
  ws.recv(msg("lobby", 11));
  a.client.close();

  const b = setup({ storage: store });
  const got = [];
  b.client.room("lobby", { onMessage: (m) => got.push(m.seq) });
  await b.clock.advance(0);
  const ws2 = b.WS.last();
  ws2.open();
  assert.deepEqual(ws2.ops("join"), [{ op: "join", room: "lobby", since: 11, epoch: "E9" }]);
  ws2.recv({ op: "joined", room: "lobby", seq: 13, epoch: "E9", recovered: true });
  ws2.recv(msg("lobby", 12));
  ws2.recv(msg("lobby", 13));
  assert.deepEqual(got, [12, 13]);
});

test("an explicit since is used when no position is stored; resume:false ignores storage", async () => {
  const env = setup();
  env.client.room("a", { since: 0 });
  const ws = await openWith(env);
  assert.deepEqual(ws.ops("join"), [{ op: "join", room: "a", since: 0 }]);

  const store = storage();
  store.setItem("roost:v1:node.test:8080/ws:demo/alice:b", JSON.stringify({ s: 5, e: "E" }));
  const env2 = setup({ storage: store });
  env2.client.room("b", { resume: false });
  const ws2 = await openWith(env2);
  assert.deepEqual(ws2.ops("join"), [{ op: "join", room: "b" }]);
});

test("after a lost connection every room resumes from its last delivered seq", async () => {
  const env = setup();
  const got = [];
  env.client.room("lobby", { onMessage: (m) => got.push(m.seq) });
  env.client.room("side", {});
  const ws = await openWith(env, "lobby", { seq: 0 });
  ws.recv({ op: "joined", room: "side", seq: 40, epoch: "S" });
  ws.recv(msg("lobby", 1));
  ws.recv(msg("lobby", 2));
  ws.serverClose(1006);
  assert.equal(env.client.state, "reconnecting");
  await env.clock.advance(1000); // the first backoff is at most 1 s
  const ws2 = env.WS.last();
  assert.notEqual(ws2, ws);
  ws2.open();
  assert.deepEqual(ws2.ops("join"), [
    { op: "join", room: "lobby", since: 2, epoch: "E1" },
    { op: "join", room: "side", since: 40, epoch: "S" },
  ]);
  ws2.recv({ op: "joined", room: "lobby", seq: 4, epoch: "E1", recovered: true });
  for (const s of [2, 3, 4]) ws2.recv(msg("lobby", s));
  assert.deepEqual(got, [1, 2, 3, 4]);
  assert.deepEqual(env.states, ["open", "reconnecting", "open"]);
});

test("the backoff is full jitter between 0.5 s and a window doubling to 20 s", async () => {
  const env = setup({ random: () => 0.999999 });
  await env.clock.advance(0);
  const want = [1000, 2000, 4000, 8000, 16000, 20000, 20000];
  for (const w of want) {
    env.WS.last().serverClose(1006);
    await flush();
    const [d] = env.clock.pending();
    assert.equal(d, w);
    await env.clock.advance(d);
  }
  // And the low end is backoffMin, never an immediate retry.
  const low = setup({ random: () => 0 });
  await low.clock.advance(0);
  low.WS.last().serverClose(1006);
  await flush();
  assert.deepEqual(low.clock.pending(), [500]);
});

test("a connection that stayed open starts the backoff over", async () => {
  const env = setup({ random: () => 0.999999 });
  await env.clock.advance(0);
  for (let i = 0; i < 3; i++) {
    env.WS.last().serverClose(1006);
    await flush();
    await env.clock.advance(Math.min(...env.clock.pending()));
  }
  assert.equal(env.WS.all.length, 4);
  env.WS.last().open();
  await env.clock.advance(6000);
  env.WS.last().serverClose(1006);
  await flush();
  assert.deepEqual(env.clock.pending(), [1000]);
});

test("retry=MS on 1013 and 1001 is waited exactly", async () => {
  for (const code of [1013, 1001]) {
    const env = setup();
    const plans = [];
    env.client.on("reconnect", (r) => plans.push(r));
    const ws = await openWith(env);
    ws.serverClose(code, "retry=3456");
    assert.equal(env.client.state, "reconnecting");
    await env.clock.advance(3455);
    assert.equal(env.WS.all.length, 1, `${code}: reconnected before the hint`);
    await env.clock.advance(1);
    assert.equal(env.WS.all.length, 2, `${code}: not reconnected at the hint`);
    assert.deepEqual(plans, [{ wait: 3456, attempt: 0, why: "hint" }]);
  }
});

test("onReset is called exactly when the node says recovered:false, then delivery goes on from `from`", async () => {
  const env = setup();
  const resets = [];
  const got = [];
  env.client.room("lobby", { onMessage: (m) => got.push(m.seq), onReset: (i) => resets.push(i) });
  const ws = await openWith(env, "lobby", { seq: 50, epoch: "E1" });
  ws.recv(msg("lobby", 51));
  ws.serverClose(1006);
  await env.clock.advance(1000);
  let w = env.WS.last();
  w.open();
  w.recv({ op: "joined", room: "lobby", seq: 51, epoch: "E1", recovered: true });
  assert.equal(resets.length, 0);
  w.serverClose(1006);
  await env.clock.advance(2000);
  w = env.WS.last();
  w.open();
  assert.deepEqual(w.ops("join")[0], { op: "join", room: "lobby", since: 51, epoch: "E1" });
  w.recv({ op: "joined", room: "lobby", seq: 3, epoch: "E2", recovered: false, from: 1 });
  for (const s of [1, 2, 3]) w.recv(msg("lobby", s));
  assert.deepEqual(resets, [{ room: "lobby", since: 51, from: 1, seq: 3, epoch: "E2", previousEpoch: "E1" }]);
  assert.deepEqual(got, [51, 1, 2, 3]);
  // The new epoch is what the next resume names.
  w.serverClose(1006);
  await env.clock.advance(4000);
  env.WS.last().open();
  assert.deepEqual(env.WS.last().ops("join")[0], { op: "join", room: "lobby", since: 3, epoch: "E2" });
});

test("retention: recovered:false with a later from skips to from and says so", async () => {
  const env = setup();
  const resets = [];
  const got = [];
  env.client.room("lobby", { since: 10, onMessage: (m) => got.push(m.seq), onReset: (i) => resets.push(i) });
  const ws = await openWith(env);
  ws.recv({ op: "joined", room: "lobby", seq: 500, epoch: "E1", recovered: false, from: 200 });
  ws.recv(msg("lobby", 200));
  ws.recv(msg("lobby", 201));
  assert.equal(resets.length, 1);
  assert.equal(resets[0].from, 200);
  assert.deepEqual(got, [200, 201]);
});

test("a node without epochs whose newest seq is behind since is a reset too", async () => {
  const env = setup();
  const resets = [];
  env.client.room("lobby", { since: 90, onReset: (i) => resets.push(i) });
  const ws = await openWith(env);
  ws.recv({ op: "joined", room: "lobby", seq: 2 });
  assert.equal(resets.length, 1);
  ws.recv(msg("lobby", 3));
  assert.equal(env.client.rooms.get("lobby").seq, 3);
});

test("publishes: queued while disconnected, re-sent with the same id after a drop, settled once", async () => {
  const env = setup();
  const room = env.client.room("lobby", {});
  const p1 = room.publish({ text: "offline" });
  await env.clock.advance(0);
  assert.equal(env.client.outbox.length, 1);
  const ws = env.WS.last();
  ws.open();
  const [pub1] = ws.ops("pub");
  assert.equal(pub1.room, "lobby");
  assert.deepEqual(pub1.body, { text: "offline" });
  const p2 = room.publish("second");
  const pub2 = ws.ops("pub")[1];
  ws.recv({ op: "ack", id: pub1.id, room: "lobby", seq: 1 });
  assert.deepEqual(await p1, { seq: 1, id: pub1.id, room: "lobby" });
  // The connection drops before pub2's ack: it goes out again, same id.
  ws.serverClose(1006);
  assert.deepEqual(env.client.outbox.map((e) => [e.id, e.sent]), [[pub2.id, false]]);
  await env.clock.advance(1000);
  const ws2 = env.WS.last();
  ws2.open();
  assert.deepEqual(ws2.ops("pub"), [pub2]);
  let settled = 0;
  p2.then(() => settled++);
  ws2.recv({ op: "ack", id: pub2.id, room: "lobby", seq: 2 });
  ws2.recv({ op: "ack", id: pub2.id, room: "lobby", seq: 2 }); // a duplicate ack
  assert.deepEqual(await p2, { seq: 2, id: pub2.id, room: "lobby" });
  await flush();
  assert.equal(settled, 1);
  assert.equal(env.client.outbox.length, 0);
  assert.notEqual(pub1.id, pub2.id);
});

test("the outbox outlives a reload: the next page re-sends every unacknowledged publish under its id, once acked it is forgotten", async () => {
  const store = storage();
  const env = setup({ storage: store });
  const room = env.client.room("lobby", {});
  const ws = await openWith(env, "lobby");
  const inFlight = room.publish({ n: 1 }, { id: "k-1" }); // sent, unacked when the page goes
  ws.serverClose(1006); // the node is down
  room.publish({ n: 2 }, { id: "k-2" }); // made while disconnected
  room.publish({ n: 3 }, { id: "k-3" });
  inFlight.catch(() => {});
  // The page is reloaded: nothing closes the client; a new one starts on
  // the same storage.
  const acks = [];
  const roomAcks = [];
  const env2 = setup({ storage: store });
  env2.client.on("ack", (a) => acks.push(a));
  const room2 = env2.client.room("lobby", { onAck: (a) => roomAcks.push(a.id) });
  assert.deepEqual(env2.client.outbox.map((e) => [e.id, e.restored, e.sent]), [["k-1", true, false], ["k-2", true, false], ["k-3", true, false]]);
  // The app may ask for a promise of a restored id by publishing it again.
  const again = room2.publish({ n: 3 }, { id: "k-3" });
  assert.equal(env2.client.outbox.length, 3);
  const ws2 = await openWith(env2, "lobby");
  const pubs = ws2.ops("pub");
  assert.deepEqual(pubs.map((f) => [f.id, f.body.n]), [["k-1", 1], ["k-2", 2], ["k-3", 3]]);
  for (const [i, f] of pubs.entries()) ws2.recv({ op: "ack", id: f.id, room: "lobby", seq: 10 + i });
  ws2.recv({ op: "ack", id: "k-1", room: "lobby", seq: 10 }); // an ack of a duplicate re-send
  assert.deepEqual(await again, { seq: 12, id: "k-3", room: "lobby" });
  assert.deepEqual(acks.map((a) => [a.id, a.seq, a.restored, a.body.n]), [["k-1", 10, true, 1], ["k-2", 11, true, 2], ["k-3", 12, true, 3]]);
  assert.deepEqual(roomAcks, ["k-1", "k-2", "k-3"]);
  assert.equal(env2.client.outbox.length, 0);
  assert.deepEqual([...store.m.keys()].filter((k) => k.includes("#outbox")), [], "acknowledged entries are forgotten");
  // A third page has nothing to re-send.
  const env3 = setup({ storage: store });
  assert.equal(env3.client.outbox.length, 0);
});

test("a stored outbox entry refused for good is forgotten and reported (nack); close() leaves the rest to the next page, close({discardOutbox}) forgets it", async () => {
  const store = storage();
  const env = setup({ storage: store });
  env.client.publish("r", "x", { id: "bad" }).catch(() => {});
  env.client.publish("r", "y", { id: "later" }).catch(() => {});
  const env2 = setup({ storage: store });
  const nacks = [];
  env2.client.on("nack", (n) => nacks.push([n.id, n.error.code, n.restored]));
  const ws = await openWith(env2);
  ws.recv({ op: "err", ref: "bad", code: "forbidden", message: "no" });
  assert.deepEqual(nacks, [["bad", "forbidden", true]]);
  assert.deepEqual(env2.client.outbox.map((e) => e.id), ["later"]);
  env2.client.close(); // on pagehide, say
  assert.deepEqual(nacks, [["bad", "forbidden", true]]);
  const env3 = setup({ storage: store });
  assert.deepEqual(env3.client.outbox.map((e) => e.id), ["later"]);
  const p = env3.client.publish("r", "y", { id: "later" });
  const nacks3 = [];
  env3.client.on("nack", (n) => nacks3.push([n.id, n.error.code]));
  env3.client.close({ discardOutbox: true }); // a logout
  await assert.rejects(p, { code: "closed" });
  assert.deepEqual(nacks3, [["later", "closed"]]);
  assert.deepEqual([...store.m.keys()].filter((k) => k.includes("#outbox")), []);
  assert.equal(setup({ storage: store }).client.outbox.length, 0);
});

test("persistOutbox:false keeps the outbox in the page; token mode stores it once the token names the user", async () => {
  const store = storage();
  const env = setup({ storage: store, options: { persistOutbox: false } });
  env.client.publish("r", "x").catch(() => {});
  assert.deepEqual([...store.m.keys()], []);

  const store2 = storage();
  const token = jwt({ app: "a1", sub: "bob", exp: 1_700_000_000 + 3600 });
  let calls = 0;
  const env2 = setup({ storage: store2, options: { user: undefined, token: async () => (calls++, token) } });
  env2.client.publish("r", "early", { id: "e-1" }).catch(() => {});
  assert.deepEqual([...store2.m.keys()], [], "the scope is unknown before the first token");
  await env2.clock.advance(0);
  assert.equal(calls, 1);
  assert.ok([...store2.m.keys()].some((k) => k.includes(":a1/bob:#outbox:0") && JSON.parse(store2.m.get(k)).id === "e-1"), [...store2.m.keys()].join(" "));
  const env3 = setup({ storage: store2, options: { user: undefined, token: async () => token } });
  assert.equal(env3.client.outbox.length, 0, "restored only once the token is known");
  await env3.clock.advance(0);
  assert.deepEqual(env3.client.outbox.map((e) => e.id), ["e-1"]);
  // Another user of the same tab does not see it.
  const other = jwt({ app: "a1", sub: "carol", exp: 1_700_000_000 + 3600 });
  const env4 = setup({ storage: store2, options: { user: undefined, token: async () => other } });
  await env4.clock.advance(0);
  assert.equal(env4.client.outbox.length, 0);
});

test("the stored outbox costs a publish or an ack a constant amount of writing, whatever its size; acks out of order restore what is left", async () => {
  const store = storage();
  let written = 0;
  let writes = 0;
  const counting = { ...store, setItem: (k, v) => { writes++; written += k.length + String(v).length; store.setItem(k, v); } };
  const env = setup({ storage: counting });
  const ws = await openWith(env);
  ws.serverClose(1006); // offline: everything waits
  for (let i = 0; i < 2000; i++) env.client.publish("r", i, { id: `k${i}` }).catch(() => {});
  assert.equal(writes, 4000, "two writes a publish: its slot and the range");
  assert.ok(written < 2000 * 200, `${written} bytes written for 2000 small publishes`);
  await env.clock.advance(1000);
  const ws2 = env.WS.last();
  ws2.open();
  const before = writes;
  // Acked out of order: all but k0, k2 and k1999.
  for (let i = 1; i < 1999; i++) if (i !== 2) ws2.recv({ op: "ack", id: `k${i}`, room: "r", seq: i });
  assert.ok(writes - before <= 2, `${writes - before} writes for 1997 acks behind an unacked head`);
  const env2 = setup({ storage: store });
  assert.deepEqual(env2.client.outbox.map((e) => e.id), ["k0", "k2", "k1999"]);
  const ws3 = await openWith(env2);
  ws3.recv({ op: "ack", id: "k0", room: "r", seq: 0 });
  ws3.recv({ op: "ack", id: "k2", room: "r", seq: 2 });
  env2.client.publish("r", "new", { id: "k-new" });
  const env3 = setup({ storage: store });
  assert.deepEqual(env3.client.outbox.map((e) => e.id), ["k1999", "k-new"]);
  const range = [...store.m.entries()].find(([k]) => k.endsWith("#outbox"));
  assert.deepEqual(range[1], "1999,2001");
});

test("an outbox entry storage cannot hold is still sent, and the app is told it will not outlive a reload", async () => {
  const store = storage();
  const full = { ...store, setItem: (k, v) => { if (k.includes("#outbox:")) throw Object.assign(new Error("quota"), { name: "QuotaExceededError" }); store.setItem(k, v); } };
  const env = setup({ storage: full });
  const ws = await openWith(env);
  const p = env.client.publish("r", "big", { id: "b-1" });
  assert.equal(env.errors[0].code, "storage");
  assert.match(env.errors[0].message, /QuotaExceededError/);
  ws.recv({ op: "ack", id: "b-1", room: "r", seq: 1 });
  assert.equal((await p).seq, 1);
});

test("publish ids are unique per client and across clients", async () => {
  const ids = new Set();
  for (let c = 0; c < 3; c++) {
    const env = setup({ random: seeded(7) }); // same seed: the prefix still differs (crypto)
    const ws = await openWith(env);
    const room = env.client.room("r", {});
    for (let i = 0; i < 100; i++) room.publish(i);
    for (const f of ws.ops("pub")) {
      assert.ok(f.id.length <= 64);
      ids.add(f.id);
    }
  }
  assert.equal(ids.size, 300);
});

test("overloaded and rate_limited are retried under the same id; other errors reject with {code, message}", async () => {
  const env = setup();
  const ws = await openWith(env);
  const room = env.client.room("lobby", {});
  const p = room.publish("x");
  const q = room.publish("y", { id: "my-key" });
  const [a, b] = ws.ops("pub");
  assert.equal(b.id, "my-key");
  ws.recv({ op: "err", ref: a.id, code: "overloaded", message: "draining" });
  assert.equal(ws.ops("pub").length, 2);
  await env.clock.advance(2000);
  assert.deepEqual(ws.ops("pub")[2], a);
  ws.recv({ op: "err", ref: "my-key", code: "forbidden", message: "token does not allow this room" });
  await assert.rejects(q, (e) => e instanceof RoostError && e.code === "forbidden" && e.message === "token does not allow this room");
  ws.recv({ op: "ack", id: a.id, room: "lobby", seq: 9 });
  assert.equal((await p).seq, 9);
});

test("a publish larger than maxFrame is refused locally (the node would close 1009)", async () => {
  const env = setup({ options: { maxFrame: 100 } });
  const room = env.client.room("lobby", {});
  await assert.rejects(room.publish("x".repeat(200)), { code: "too_large" });
  await assert.rejects(room.publish(undefined), { code: "bad_request" });
  assert.equal(env.client.outbox.length, 0);
});

test("publishing the same id twice while pending gives the same promise", async () => {
  const env = setup();
  const room = env.client.room("lobby", {});
  const a = room.publish("x", { id: "k" });
  const b = room.publish("x", { id: "k" });
  assert.equal(a, b);
  assert.equal(env.client.outbox.length, 1);
});

test("maxInFlight bounds the unanswered publishes on a connection", async () => {
  const env = setup({ options: { maxInFlight: 2 } });
  const ws = await openWith(env);
  const room = env.client.room("lobby", {});
  for (let i = 0; i < 5; i++) room.publish(i);
  assert.equal(ws.ops("pub").length, 2);
  ws.recv({ op: "ack", id: ws.ops("pub")[0].id, room: "lobby", seq: 1 });
  assert.equal(ws.ops("pub").length, 3);
});

test("close() rejects what is pending with code closed and stops reconnecting", async () => {
  const env = setup();
  const room = env.client.room("lobby", {});
  const p = room.publish("x");
  const h = room.history();
  env.client.close();
  await assert.rejects(p, { code: "closed" });
  await assert.rejects(h, { code: "closed" });
  await env.clock.advance(60000);
  assert.equal(env.WS.all.length, 0);
  assert.equal(env.client.state, "closed");
  await assert.rejects(room.publish("late"), { code: "closed" });
});

test("a refused connection (HTTP 401) stops the client with the node's reason, no reconnect loop", async () => {
  const fetch = fakeFetch(() => ({ status: 401, body: "token signature does not match the app's secret\n" }));
  let calls = 0;
  const env = setup({
    fetch,
    options: { user: undefined, token: async () => jwt({ app: "a", sub: "u", exp: 2_000_000_000 + calls++ }) },
  });
  await env.clock.advance(0);
  env.WS.last().serverClose(1006); // what a browser shows for a 401
  await env.clock.advance(0);
  assert.equal(env.client.state, "closed");
  assert.equal(env.client.error.code, "unauthorized");
  assert.match(env.client.error.message, /401 token signature does not match/);
  assert.equal(env.errors.at(-1), env.client.error);
  assert.equal(calls, 1);
  assert.match(fetch.calls[0], /^http:\/\/node\.test:8080\/ws\?token=/);
  await env.clock.advance(120000);
  assert.equal(env.WS.all.length, 1);
});

test("a cached token refused at reconnect is replaced once by the callback before giving up", async () => {
  let status = 200;
  const fetch = fakeFetch(() => ({ status, body: "token expired" }));
  let calls = 0;
  const env = setup({
    fetch,
    options: { user: undefined, token: async () => jwt({ app: "a", sub: "u", exp: 1_700_003_600 + calls++ }) },
  });
  const ws = await openWith(env);
  assert.equal(calls, 1);
  ws.serverClose(1006);
  await env.clock.advance(1000);
  status = 401;
  env.WS.last().serverClose(1006); // the cached token is refused
  await env.clock.advance(0);
  assert.equal(calls, 2, "asked the callback for a new token");
  assert.equal(env.WS.all.length, 3);
  env.WS.last().serverClose(1006); // and the new one too
  await env.clock.advance(0);
  assert.equal(env.client.state, "closed");
  assert.equal(env.client.error.code, "unauthorized");
});

test("token refresh: jittered before expiry, through the auth op; the node's exp is kept", async () => {
  const life = 600; // s
  let n = 0;
  const clockStart = 1_700_000_000;
  const env = setup({
    options: { user: undefined, token: async () => jwt({ app: "a", sub: "u", exp: clockStart + life * ++n }) },
  });
  const ws = await openWith(env);
  const [d] = env.clock.pending().filter((x) => x > 30000);
  assert.ok(d >= 0.6 * life * 1000 && d <= 0.85 * life * 1000, `refresh at ${d} ms of a ${life} s token`);
  await env.clock.advance(d);
  const [auth] = ws.ops("auth");
  assert.ok(auth.token);
  ws.recv({ op: "authed", exp: clockStart + 1200 });
  // The next refresh is planned from the new expiry.
  const left = (clockStart + 1200) * 1000 - env.clock.now();
  const [d2] = env.clock.pending().filter((x) => x > 30000);
  assert.ok(d2 >= 0.6 * left && d2 <= 0.85 * left);
  assert.equal(env.client.state, "open");
});

test("refresh times of many clients spread over the window", async () => {
  const random = seeded(42);
  const times = [];
  for (let i = 0; i < 200; i++) {
    const env = setup({ random, options: { user: undefined, token: async () => jwt({ app: "a", sub: "u", exp: 1_700_000_000 + 1000 }) } });
    await openWith(env);
    times.push(env.clock.pending().find((x) => x > 30000));
    env.client.close();
  }
  const buckets = new Array(5).fill(0);
  for (const t of times) buckets[Math.min(4, Math.floor(((t / 1e6) - 0.6) / 0.05))]++;
  for (const b of buckets) assert.ok(b >= 20 && b <= 60, `refresh buckets ${buckets}`);
});

test("a refused refresh stops the client with a clear error", async () => {
  const env = setup({ options: { user: undefined, token: async () => jwt({ app: "a", sub: "u", exp: 1_700_000_100 }) } });
  const ws = await openWith(env);
  await env.clock.advance(95000);
  assert.equal(ws.ops("auth").length, 1);
  ws.recv({ op: "err", code: "forbidden", message: "token is for another user" });
  assert.equal(env.client.state, "closed");
  assert.equal(env.client.error.code, "token_refused");
  assert.match(env.client.error.message, /refused the refreshed token: token is for another user/);
  await env.clock.advance(60000);
  assert.equal(env.WS.all.length, 1);
});

test("1008 token expired reconnects with a new token; other 1008 closes stop the client", async () => {
  let n = 0;
  const env = setup({ options: { user: undefined, token: async () => jwt({ app: "a", sub: "u", exp: 1_700_000_000 + 3600, n: ++n }) } });
  const ws = await openWith(env);
  ws.serverClose(1008, "token expired");
  await env.clock.advance(1000);
  assert.equal(n, 2);
  const ws2 = env.WS.last();
  assert.notEqual(ws2.query.get("token"), ws.query.get("token"));
  ws2.open();
  ws2.serverClose(1008, "app disabled");
  assert.equal(env.client.state, "closed");
  assert.equal(env.client.error.code, "policy");
  assert.match(env.client.error.message, /app disabled/);
});

test("1008 connection limit backs off and tries again", async () => {
  const env = setup();
  const ws = await openWith(env);
  ws.serverClose(1008, "connection limit");
  assert.equal(env.client.state, "reconnecting");
  await env.clock.advance(1000);
  assert.equal(env.WS.all.length, 2);
});

test("a token callback that throws is retried with backoff, not fatal", async () => {
  let fail = true;
  const env = setup({
    options: {
      user: undefined,
      token: async () => {
        if (fail) throw new Error("backend down");
        return jwt({ app: "a", sub: "u", exp: 1_700_003_600 });
      },
    },
  });
  await env.clock.advance(0);
  assert.equal(env.WS.all.length, 0);
  assert.equal(env.errors[0].code, "token_callback");
  fail = false;
  await env.clock.advance(1000);
  assert.equal(env.WS.all.length, 1);
});

test("SSE fallback: listen-only when WebSocket cannot open but HTTP reaches the node", async () => {
  const fetch = fakeFetch(() => ({ status: 426, body: "upgrade required" }));
  const env = setup({ fetch, options: { sse: true } });
  const got = [];
  env.client.room("a", { since: 4, onMessage: (m) => got.push(m.seq) });
  env.client.room("b:c", {});
  await env.clock.advance(0);
  env.WS.last().serverClose(1006);
  await env.clock.advance(1000);
  env.WS.last().serverClose(1006);
  await env.clock.advance(0);
  const es = env.ES.last();
  assert.ok(es, "an EventSource was opened");
  const u = new URL(es.url);
  assert.equal(u.origin + u.pathname, "http://node.test:8080/sse");
  assert.deepEqual(u.searchParams.getAll("room"), ["a", "b:c"]);
  assert.equal(u.searchParams.get("since"), "a:4");
  assert.equal(u.searchParams.get("user"), "alice");
  es.open();
  assert.equal(env.client.state, "open");
  assert.equal(env.client.transport, "sse");
  es.event("joined", { op: "joined", room: "a", seq: 6, epoch: "E", recovered: true });
  es.event("msg", msg("a", 5));
  es.event("msg", msg("a", 6));
  assert.deepEqual(got, [5, 6]);
  // Publishes wait in the outbox: the stream is listen-only.
  const p = env.client.rooms.get("a").publish("later");
  assert.equal(env.client.outbox.length, 1);
  // A probe finds WebSocket working again: the client moves back.
  const [probeAt] = env.clock.pending();
  assert.ok(probeAt >= 15000 && probeAt <= 45000, `probe after ${probeAt} ms`);
  await env.clock.advance(probeAt);
  const ws = env.WS.last();
  ws.open();
  assert.equal(es.closed, true);
  assert.equal(env.client.transport, "websocket");
  assert.deepEqual(ws.ops("join")[0], { op: "join", room: "a", since: 6, epoch: "E" });
  const [pub] = ws.ops("pub");
  ws.recv({ op: "ack", id: pub.id, room: "a", seq: 7 });
  assert.equal((await p).seq, 7);
});

test("without sse allowed, a blocked WebSocket keeps backing off", async () => {
  const fetch = fakeFetch(() => ({ status: 426, body: "upgrade required" }));
  const env = setup({ fetch });
  await env.clock.advance(0);
  for (let i = 0; i < 4; i++) {
    env.WS.last().serverClose(1006);
    await env.clock.advance(20000);
  }
  assert.equal(env.ES.all.length, 0);
  assert.equal(env.client.state, "connecting");
});

test("an SSE stream the browser gave up on goes back to WebSocket", async () => {
  const fetch = fakeFetch(() => ({ status: 426, body: "" }));
  const env = setup({ fetch, options: { sse: true, sseAfter: 1 } });
  env.client.room("a", {});
  await env.clock.advance(0);
  env.WS.last().serverClose(1006);
  await env.clock.advance(0);
  const es = env.ES.last();
  es.open();
  es.event("joined", { room: "a", seq: 1 });
  es.fail(false); // the browser reconnects by itself
  assert.equal(env.client.state, "reconnecting");
  es.open();
  assert.equal(env.client.state, "open");
  es.fail(true);
  assert.equal(env.client.state, "reconnecting");
  await env.clock.advance(1000);
  assert.equal(env.WS.all.length, 2);
});

test("once SSE has served, one blocked WebSocket sends the client back to SSE, resuming from its positions", async () => {
  const fetch = fakeFetch(() => ({ status: 426, body: "" }));
  const env = setup({ fetch, options: { sse: true } }); // sseAfter 2
  const got = [];
  env.client.room("a", { onMessage: (m) => got.push(m.seq) });
  await env.clock.advance(0);
  env.WS.last().serverClose(1006);
  await env.clock.advance(1000);
  env.WS.last().serverClose(1006);
  await env.clock.advance(0);
  const es = env.ES.last();
  es.open();
  es.event("joined", { room: "a", seq: 2, epoch: "E" });
  es.event("msg", msg("a", 3));
  es.fail(true); // the stream's node went away for good (a 502 of the proxy)
  await env.clock.advance(1000);
  assert.equal(env.WS.all.length, 3);
  env.WS.last().serverClose(1006); // still blocked
  await env.clock.advance(0);
  assert.equal(env.ES.all.length, 2, "straight back to SSE");
  const es2 = env.ES.last();
  assert.equal(es2.query.get("since"), "a:3");
  es2.open();
  es2.event("joined", { room: "a", seq: 4, epoch: "E", recovered: true });
  es2.event("msg", msg("a", 3)); // a replay overlapping what was delivered
  es2.event("msg", msg("a", 4));
  assert.deepEqual(got, [3, 4]);
  assert.equal(env.client.transport, "sse");
});

test("transport: \"sse\" listens over SSE only: no WebSocket, no probe; a stream the browser gave up on is reopened after the backoff", async () => {
  const env = setup({ options: { transport: "sse" } });
  const got = [];
  env.client.room("a", { onMessage: (m) => got.push(m.seq) });
  await env.clock.advance(0);
  assert.equal(env.WS.all.length, 0);
  const es = env.ES.last();
  es.open();
  assert.equal(env.client.transport, "sse");
  es.event("joined", { room: "a", seq: 0, epoch: "E" });
  es.event("msg", msg("a", 1));
  assert.deepEqual(env.clock.pending(), [], "no WebSocket probe");
  es.fail(true);
  await env.clock.advance(1000);
  assert.equal(env.WS.all.length, 0);
  const es2 = env.ES.last();
  assert.notEqual(es2, es);
  assert.equal(es2.query.get("since"), "a:1");
  es2.open();
  es2.event("msg", msg("a", 2));
  assert.deepEqual(got, [1, 2]);
});

test("a seq gap the node did not announce is never delivered past: the client resumes", async () => {
  const env = setup();
  const got = [];
  env.client.room("lobby", { onMessage: (m) => got.push(m.seq) });
  const ws = await openWith(env, "lobby", { seq: 1 });
  ws.recv(msg("lobby", 2));
  ws.recv(msg("lobby", 4));
  assert.deepEqual(got, [2]);
  assert.equal(env.errors[0].code, "gap");
  await env.clock.advance(1000);
  env.WS.last().open();
  assert.deepEqual(env.WS.last().ops("join")[0], { op: "join", room: "lobby", since: 2, epoch: "E1" });
});

test("presence: each join asks for diffs and a snapshot; onPresence gets what changed, once; presence() answers", async () => {
  const env = setup();
  const diffs = [];
  const room = env.client.room("lobby", { presence: true, onPresence: (d) => diffs.push(d) });
  const ws = await openWith(env, "lobby");
  assert.deepEqual(ws.ops("join"), [{ op: "join", room: "lobby", presence: true }]);
  // After joined, the client asks who is here.
  assert.deepEqual(ws.ops("presence"), [{ op: "presence", room: "lobby" }]);
  ws.recv({ op: "presence_diff", room: "lobby", joined: ["bob"], left: ["carol"] }); // carol was never known
  ws.recv({ op: "presence", room: "lobby", count: 2, users: ["alice", "bob"] });
  await flush();
  assert.deepEqual(diffs, [
    { room: "lobby", joined: ["bob"], left: [], snapshot: false },
    { room: "lobby", joined: ["alice"], left: [], snapshot: true },
  ]);
  assert.deepEqual(room.members, ["alice", "bob"]);
  ws.recv({ op: "presence_diff", room: "lobby", joined: ["dave"], left: ["bob"] });
  assert.deepEqual(diffs.at(-1), { room: "lobby", joined: ["dave"], left: ["bob"], snapshot: false });
  ws.recv({ op: "presence_diff", room: "lobby", joined: ["dave"], left: [] }); // nothing new: not told
  assert.equal(diffs.length, 3);
  // The app's own query.
  const p = room.presence();
  assert.equal(ws.ops("presence").length, 2);
  ws.recv({ op: "presence", room: "lobby", count: 2, users: ["alice", "dave"] });
  assert.deepEqual(await p, { room: "lobby", count: 2, users: ["alice", "dave"] });

  // A reconnect: the diffs of the time away are lost with the connection;
  // the new snapshot gives the app the difference.
  ws.serverClose(1006);
  await env.clock.advance(1000);
  const ws2 = env.WS.last();
  ws2.open();
  assert.deepEqual(ws2.ops("join")[0].presence, true);
  ws2.recv({ op: "joined", room: "lobby", seq: 0, epoch: "E1", recovered: true });
  ws2.recv({ op: "presence", room: "lobby", count: 2, users: ["alice", "erin"] });
  await flush();
  assert.deepEqual(diffs.at(-1), { room: "lobby", joined: ["erin"], left: ["dave"], snapshot: true });
  assert.equal(diffs.length, 4);
  assert.deepEqual(room.members, ["alice", "erin"]);
});

test("presence against a node without it: the snapshot's refusal is quiet; without presence:true no members", async () => {
  const env = setup();
  const diffs = [];
  const room = env.client.room("lobby", { presence: true, onPresence: (d) => diffs.push(d) });
  const plain = env.client.room("other", {});
  const ws = await openWith(env, "lobby");
  ws.recv({ op: "err", ref: "lobby", code: "bad_request", message: "unknown op" });
  await flush();
  assert.deepEqual(diffs, []);
  assert.deepEqual(env.errors, []);
  assert.deepEqual(room.members, []);
  assert.equal(plain.members, undefined);
  // The app's own query is told.
  const q = room.presence();
  ws.recv({ op: "err", ref: "lobby", code: "bad_request", message: "unknown op" });
  await assert.rejects(q, { code: "bad_request" });
});

test("presence: a snapshot older than a diff does not undo it; a partial snapshot (more) removes nobody; a busy node is asked again", async () => {
  const env = setup();
  const diffs = [];
  const room = env.client.room("lobby", { presence: true, onPresence: (d) => diffs.push(d) });
  const ws = await openWith(env, "lobby");
  ws.recv({ op: "presence", room: "lobby", count: 3, users: ["alice", "bob", "carol"] });
  await flush();
  assert.deepEqual(room.members, ["alice", "bob", "carol"]);
  // Reconnect: a diff arrives before the new snapshot, which lags it.
  ws.serverClose(1006);
  await env.clock.advance(1000);
  const ws2 = env.WS.last();
  ws2.open();
  ws2.recv({ op: "joined", room: "lobby", seq: 0, epoch: "E1", recovered: true });
  ws2.recv({ op: "presence_diff", room: "lobby", joined: ["dave"], left: ["bob"] });
  ws2.recv({ op: "presence", room: "lobby", count: 3, users: ["alice", "bob", "carol"] }); // from before the diff
  await flush();
  assert.deepEqual(room.members, ["alice", "carol", "dave"]);
  // More than the answer holds: nobody is removed for being absent.
  ws2.serverClose(1006);
  await env.clock.advance(1000);
  const ws3 = env.WS.last();
  ws3.open();
  ws3.recv({ op: "joined", room: "lobby", seq: 0, epoch: "E1", recovered: true });
  ws3.recv({ op: "err", ref: "lobby", code: "rate_limited", message: "too many requests waiting" });
  await flush();
  assert.equal(ws3.ops("presence").length, 1);
  await env.clock.advance(1000);
  assert.equal(ws3.ops("presence").length, 2, "the snapshot is asked again");
  ws3.recv({ op: "presence", room: "lobby", count: 1500, users: ["alice", "erin"], more: true });
  await flush();
  assert.deepEqual(room.members, ["alice", "carol", "dave", "erin"]);
  assert.deepEqual(diffs.at(-1), { room: "lobby", joined: ["erin"], left: [], snapshot: true });
});

test("presence: a join refused for the room's presence limit is joined again without presence, and the app is told", async () => {
  const env = setup();
  const got = [];
  const room = env.client.room("lobby", { presence: true, onMessage: (m) => got.push(m.seq) });
  const ws = await openWith(env);
  assert.deepEqual(ws.ops("join"), [{ op: "join", room: "lobby", presence: true }]);
  ws.recv({ op: "err", ref: "lobby", code: "forbidden", message: "presence subscriber limit of this room reached: join without presence" });
  assert.deepEqual(ws.ops("join")[1], { op: "join", room: "lobby" });
  assert.equal(env.errors[0].code, "presence_limit");
  ws.recv({ op: "joined", room: "lobby", seq: 3, epoch: "E1" });
  assert.equal(room.joined, true);
  assert.equal(ws.ops("presence").length, 0, "no snapshot without presence");
  ws.recv(msg("lobby", 4));
  assert.deepEqual(got, [4]);
  // The next connection asks for presence again.
  ws.serverClose(1006);
  await env.clock.advance(1000);
  env.WS.last().open();
  assert.equal(env.WS.last().ops("join")[0].presence, true);
});

test("history requests wait for a connection and survive a reconnect", async () => {
  const env = setup();
  const room = env.client.room("lobby", {});
  const h = room.history({ before: 10, limit: 5 });
  await env.clock.advance(0);
  const ws = env.WS.last();
  ws.open();
  assert.deepEqual(ws.ops("history"), [{ op: "history", room: "lobby", limit: 5, before: 10 }]);
  ws.serverClose(1006);
  await env.clock.advance(1000);
  const ws2 = env.WS.last();
  ws2.open();
  assert.equal(ws2.ops("history").length, 1);
  ws2.recv({ op: "history", room: "lobby", messages: [{ seq: 9 }], more: false });
  assert.deepEqual(await h, { room: "lobby", messages: [{ seq: 9 }], more: false });
});

test("a join refused by the node is reported and not retried; overloaded joins are", async () => {
  const env = setup();
  const errs = [];
  env.client.room("secret", { onError: (e) => errs.push(e) });
  env.client.room("busy", {});
  const ws = await openWith(env);
  ws.recv({ op: "err", ref: "secret", code: "forbidden", message: "token does not allow this room" });
  ws.recv({ op: "err", ref: "busy", code: "overloaded", message: "read queue full" });
  assert.equal(errs[0].code, "forbidden");
  await env.clock.advance(1000);
  assert.deepEqual(ws.ops("join").map((j) => j.room), ["secret", "busy", "busy"]);
  ws.serverClose(1006);
  await env.clock.advance(2000);
  env.WS.last().open();
  assert.deepEqual(env.WS.last().ops("join").map((j) => j.room), ["busy"]);
});

test("a silent connection is checked with a ping and dropped when nothing answers", async () => {
  const env = setup({ options: { pingInterval: 1000, pongTimeout: 500 } });
  const ws = await openWith(env);
  await env.clock.advance(1000);
  assert.equal(ws.ops("ping").length, 1);
  ws.recv({ op: "pong" });
  await env.clock.advance(1000);
  assert.equal(ws.ops("ping").length, 2);
  await env.clock.advance(600);
  assert.equal(env.client.state, "reconnecting");
  assert.ok(ws.clientClosed);
});

test("a connect that never opens times out and is retried", async () => {
  const env = setup({ options: { connectTimeout: 3000 } });
  await env.clock.advance(3000);
  assert.ok(env.WS.all[0].clientClosed);
  await env.clock.advance(1000);
  assert.equal(env.WS.all.length, 2);
});

test("leave() sends leave and forgets the position; room names are checked", async () => {
  const env = setup();
  const room = env.client.room("lobby", {});
  const ws = await openWith(env, "lobby", { seq: 3 });
  assert.ok([...env.store.m.keys()].some((k) => k.endsWith(":lobby")));
  room.leave();
  assert.deepEqual(ws.ops("leave"), [{ op: "leave", room: "lobby" }]);
  assert.ok(![...env.store.m.keys()].some((k) => k.endsWith(":lobby")));
  ws.recv(msg("lobby", 4)); // in flight before the leave: dropped
  assert.throws(() => env.client.room("bad room", {}), TypeError);
  env.client.room("lobby", {}); // may be opened again
  assert.throws(() => env.client.room("lobby", {}), /already open/);
});

test("a throwing onMessage does not stop delivery", async () => {
  const env = setup();
  const got = [];
  env.client.room("lobby", {
    onMessage: (m) => {
      got.push(m.seq);
      if (m.seq === 1) throw new Error("app bug");
    },
  });
  const ws = await openWith(env, "lobby");
  const uncaught = [];
  setErrorReporter((e) => uncaught.push(e));
  ws.recv(msg("lobby", 1));
  ws.recv(msg("lobby", 2));
  setErrorReporter(() => {});
  assert.deepEqual(got, [1, 2]);
  assert.equal(uncaught[0].message, "app bug");
});

test("storage may be replaced: memoryStorage, or null for none", async () => {
  const mem = memoryStorage();
  const env = setup({ storage: mem });
  env.client.room("lobby", {});
  await openWith(env, "lobby", { seq: 8 });
  assert.equal(JSON.parse(mem.getItem("roost:v1:node.test:8080/ws:demo/alice:lobby")).s, 8);
  const none = setup({ options: { storage: null } });
  none.client.room("lobby", {});
  await openWith(none, "lobby", { seq: 8 });
  assert.equal(none.store.m.size, 0);
});

test("token mode scopes positions by the token's app and sub", async () => {
  const env = setup({ options: { user: undefined, token: jwt({ app: "chat", sub: "u7", exp: 1_800_000_000 }) } });
  env.client.room("lobby", {});
  await openWith(env, "lobby", { seq: 2 });
  assert.ok(env.store.m.has("roost:v1:node.test:8080/ws:chat/u7:lobby"));
});

test("the constructor refuses what cannot work", () => {
  assert.throws(() => new Roost("http://x/ws", { user: "a" }), TypeError);
  assert.throws(() => new Roost("ws://x/ws", {}), /token/);
});
