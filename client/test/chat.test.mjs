// Unit tests of roost.js's chat state and changing messages: signals,
// read marks, unread counts, receipts, the inbox, edits, deletes and
// reactions folded into a room's view. The test plays the node through a
// fake WebSocket (test/fakes.mjs) and owns the clock.
import { test } from "node:test";
import assert from "node:assert/strict";

import { Roost, RoostError } from "../roost.js";
import { FakeClock, fakeWebSocket, fakeEventSource, fakeFetch, storage, seeded, jwt } from "./fakes.mjs";

function setup(options = {}) {
  const clock = new FakeClock();
  const WS = fakeWebSocket();
  const client = new Roost("ws://node.test:8080/ws", {
    user: "alice",
    app: "demo",
    WebSocket: WS,
    fetch: fakeFetch(() => null),
    storage: storage(),
    clock,
    random: seeded(1),
    pingInterval: 0,
    ...options,
  });
  const errors = [];
  client.on("error", (e) => errors.push(e));
  return { clock, WS, client, errors };
}

async function open(env, room, joined) {
  await env.clock.advance(0);
  const ws = env.WS.last();
  ws.open();
  if (room) ws.recv({ op: "joined", room, seq: 0, epoch: "E1", ...joined });
  return ws;
}

const msg = (room, seq, extra) => ({ op: "msg", room, seq, id: `m-${seq}`, from: "bob", ts: 1000 + seq, body: { n: seq }, ...extra });

test("signals: sent to the room, others' delivered to onSignal, own ignored, never queued", async () => {
  const env = setup();
  const got = [];
  const room = env.client.room("r", { onSignal: (s) => got.push(s) });
  assert.equal(room.signal({ typing: true }), false, "no connection: not sent, not queued");
  const ws = await open(env, "r");
  assert.equal(room.signal({ typing: true }), true);
  assert.deepEqual(ws.ops("signal"), [{ op: "signal", room: "r", body: { typing: true } }]);
  ws.recv({ op: "signal", room: "r", from: "bob", body: { typing: true } });
  ws.recv({ op: "signal", room: "r", from: "alice", body: { typing: true } }); // another tab of ours
  assert.deepEqual(got, [{ room: "r", from: "bob", body: { typing: true } }]);
  assert.equal(room.messages.length, 0, "a signal is no message");
});

test("signals: over 1 KiB throws too_large; over the rate, false until tokens come back", async () => {
  const env = setup();
  const room = env.client.room("r");
  await open(env, "r");
  assert.throws(() => room.signal("x".repeat(1100)), (e) => e instanceof RoostError && e.code === "too_large");
  let sent = 0;
  for (let i = 0; i < 30; i++) if (room.signal(i)) sent++;
  assert.equal(sent, 20, "the burst");
  assert.equal(room.signal("more"), false);
  await env.clock.advance(1000);
  let again = 0;
  for (let i = 0; i < 30; i++) if (room.signal(i)) again++;
  assert.equal(again, 10, "10 a second");
});

test("join flags: echo false and receipts", async () => {
  const env = setup();
  env.client.room("a", { echo: false });
  env.client.room("b", { onReceipts() {} });
  env.client.room("c");
  const ws = await open(env);
  assert.deepEqual(ws.ops("join"), [
    { op: "join", room: "a", echo: false },
    { op: "join", room: "b", receipts: true },
    { op: "join", room: "c" },
  ]);
});

test("markRead: coalesced to one mark per second, the highest, never backwards", async () => {
  const env = setup();
  const room = env.client.room("r");
  const ws = await open(env, "r");
  room.markRead(3);
  room.markRead(5);
  room.markRead(4);
  room.markRead(9);
  assert.deepEqual(ws.ops("read"), [{ op: "read", room: "r", seq: 3 }]);
  await env.clock.advance(1000);
  assert.deepEqual(ws.ops("read").map((f) => f.seq), [3, 9]);
  await env.clock.advance(5000);
  assert.equal(ws.ops("read").length, 2, "nothing new: nothing sent");
  room.markRead(2);
  assert.equal(room.read, 9);
  assert.throws(() => room.markRead(1.5), (e) => e.code === "bad_request");
});

test("a mark made while disconnected is sent after the join", async () => {
  const env = setup();
  const room = env.client.room("r");
  room.markRead(7);
  const ws = await open(env, "r");
  assert.deepEqual(ws.ops("read"), [{ op: "read", room: "r", seq: 7 }]);
});

test("read frames from other tabs move the position and the unread count; own publishes too", async () => {
  const env = setup();
  const reads = [];
  const unread = [];
  const room = env.client.room("r", { onRead: (r) => reads.push(r.seq), onUnread: (u) => unread.push(u.count) });
  const ws = await open(env, "r");
  ws.recv(msg("r", 1));
  ws.recv(msg("r", 2));
  ws.recv(msg("r", 3, { from: "alice" })); // own: never unread
  ws.recv(msg("r", 4, { kind: "react", ref: 1, body: "👍" })); // not a message
  assert.equal(room.unread, 2);
  ws.recv({ op: "read", room: "r", seq: 1 });
  assert.equal(room.read, 1);
  assert.equal(room.unread, 1);
  ws.recv({ op: "read", room: "r", seq: 0 }); // never backwards
  assert.equal(room.read, 1);
  const p = room.publish("hi");
  const pub = ws.ops("pub").at(-1);
  ws.recv({ op: "ack", id: pub.id, room: "r", seq: 5 });
  await p;
  assert.equal(room.read, 5);
  assert.equal(room.unread, 0);
  assert.deepEqual(reads, [1, 5]);
  assert.deepEqual(unread, [1, 2, 1, 0]);
});

test("client.unread asks the node for up to 100 rooms and seeds the rooms' counts", async () => {
  const env = setup();
  const a = env.client.room("a");
  const ws = await open(env, "a");
  const p = env.client.unread(["a", "b"]);
  await env.clock.advance(0);
  assert.deepEqual(ws.ops("unread"), [{ op: "unread", rooms: ["a", "b"] }]);
  ws.recv({ op: "unread", rooms: { a: { read: 55, seq: 58, count: 3 }, b: { read: 0, seq: 2, count: 2 } } });
  assert.deepEqual(await p, { a: { read: 55, seq: 58, count: 3 }, b: { read: 0, seq: 2, count: 2 } });
  assert.equal(a.unread, 3);
  assert.equal(a.read, 55);
  ws.recv({ op: "joined", room: "a", seq: 58, epoch: "E1" });
  ws.recv(msg("a", 59));
  assert.equal(a.unread, 4);
  ws.recv({ op: "read", room: "a", seq: 59 });
  assert.equal(a.unread, 0);
  await assert.rejects(env.client.unread([]), (e) => e.code === "bad_request");
  await assert.rejects(env.client.unread(Array.from({ length: 101 }, (_, i) => "r" + i)), (e) => e.code === "bad_request");
});

// ownPublish publishes body in room as alice, acknowledged at seq and
// echoed as the room's message.
async function ownPublish(env, ws, room, body, seq) {
  const p = room.publish(body);
  await env.clock.advance(0);
  ws.recv({ op: "ack", id: ws.ops("pub").at(-1).id, room: room.name, seq });
  await p;
  ws.recv(msg(room.name, seq, { from: "alice", body }));
}

test("an unread answer counted from an older position than the client's: read up to its end counts nothing, part of it is asked again once", async () => {
  // The node takes the position when asked and reads the count from the
  // store later: an own publish acknowledged in between is in the count.
  const env = setup();
  const room = env.client.room("r");
  const ws = await open(env, "r");
  const asked = env.client.unread(["r"]);
  await ownPublish(env, ws, room, "hi", 1);
  ws.recv({ op: "unread", rooms: { r: { read: 0, seq: 1, count: 1 } } });
  await asked;
  assert.equal(room.read, 1);
  assert.equal(room.unread, 0, "the own message the answer counted is read");
  ws.recv(msg("r", 2));
  assert.equal(room.unread, 1);
  assert.equal(ws.ops("unread").length, 1, "nothing to ask again");

  // Read past where the node counted from, short of its end: how much of
  // the count is left is the node's to say, asked once.
  const again = env.client.unread(["r"]);
  await ownPublish(env, ws, room, "again", 3);
  ws.recv({ op: "unread", rooms: { r: { read: 1, seq: 5, count: 3 } } }); // 2, 4, 5 (3 is the client's own)
  await again;
  await env.clock.advance(0);
  assert.equal(ws.ops("unread").length, 3, "asked again");
  ws.recv({ op: "unread", rooms: { r: { read: 3, seq: 5, count: 2 } } });
  await env.clock.advance(0);
  assert.equal(room.unread, 2);
  assert.equal(ws.ops("unread").length, 3, "once");
});

test("an unread answer older than a mark still waiting to be sent is asked again after the mark's answer", async () => {
  const env = setup();
  const room = env.client.room("r");
  const ws = await open(env, "r");
  for (let s = 1; s <= 6; s++) ws.recv(msg("r", s));
  room.markRead(2); // sent at once
  room.markRead(4); // waits for readEvery
  assert.deepEqual(ws.ops("read"), [{ op: "read", room: "r", seq: 2 }]);
  const asked = env.client.unread(["r"]);
  await env.clock.advance(0);
  ws.recv({ op: "unread", rooms: { r: { read: 2, seq: 6, count: 4 } } });
  await asked;
  assert.equal(ws.ops("unread").length, 1, "the mark is not at the node yet: asking now would count from 2 again");
  await env.clock.advance(1000);
  assert.deepEqual(ws.ops("read").at(-1), { op: "read", room: "r", seq: 4 });
  ws.recv({ op: "read", room: "r", seq: 4 });
  await env.clock.advance(0);
  assert.equal(ws.ops("unread").length, 2, "asked after the mark's answer");
  ws.recv({ op: "unread", rooms: { r: { read: 4, seq: 6, count: 2 } } });
  await env.clock.advance(0);
  assert.equal(room.unread, 2);
});

test("receipts: pushed frames to onReceipts, the query answered", async () => {
  const env = setup();
  const got = [];
  const room = env.client.room("r", { onReceipts: (r) => got.push(r) });
  const ws = await open(env, "r");
  ws.recv({ op: "receipts", room: "r", read: { bob: 58 } });
  assert.deepEqual(got, [{ room: "r", read: { bob: 58 } }]);
  const q = room.receipts();
  await env.clock.advance(0);
  assert.deepEqual(ws.ops("receipts"), [{ op: "receipts", room: "r" }]);
  ws.recv({ op: "receipts", room: "r", read: { bob: 58, carol: 55 } });
  assert.deepEqual(await q, { room: "r", read: { bob: 58, carol: 55 } });
  assert.equal(got.length, 1);
});

test("the inbox is the room @user, with the token's subject too", async () => {
  const env = setup();
  const inbox = env.client.inbox();
  assert.equal(inbox.name, "@alice");
  assert.equal(env.client.inbox(), inbox);
  const ws = await open(env, "@alice");
  assert.deepEqual(ws.ops("join"), [{ op: "join", room: "@alice" }]);
  const t = setup({ user: undefined, token: jwt({ app: "demo", sub: "bob", exp: 2_000_000_000 }) });
  assert.equal(t.client.inbox().name, "@bob");
});

test("edits, deletes and reactions: sent as kinds with ref, folded into the view in order", async () => {
  const env = setup();
  const changes = [];
  const room = env.client.room("r", { onChange: (m) => changes.push(m) });
  const ws = await open(env, "r");
  ws.recv(msg("r", 1, { from: "alice", body: "helo" }));
  ws.recv(msg("r", 2, { body: "hi" }));
  room.edit(1, "hello");
  room.react(2, "👍");
  room.unreact(2, "👍");
  room.delete(1);
  await env.clock.advance(0);
  assert.deepEqual(ws.ops("pub").map(({ id, ...f }) => f), [
    { op: "pub", room: "r", kind: "edit", ref: 1, body: "hello" },
    { op: "pub", room: "r", kind: "react", ref: 2, body: "👍" },
    { op: "pub", room: "r", kind: "unreact", ref: 2, body: "👍" },
    { op: "pub", room: "r", kind: "delete", ref: 1 },
  ]);
  ws.recv(msg("r", 3, { from: "alice", kind: "edit", ref: 1, body: "hello" }));
  ws.recv(msg("r", 4, { from: "carol", kind: "react", ref: 2, body: "👍" }));
  ws.recv(msg("r", 5, { from: "dave", kind: "react", ref: 2, body: "👍" }));
  ws.recv(msg("r", 6, { from: "dave", kind: "unreact", ref: 2, body: "👍" }));
  ws.recv(msg("r", 7, { from: "carol", kind: "react", ref: 2, body: "🎉" }));
  assert.deepEqual(room.messages.map(({ seq, body, edited, deleted, reactions }) => ({ seq, body, edited, deleted, reactions })), [
    { seq: 1, body: "hello", edited: 1003, deleted: false, reactions: {} },
    { seq: 2, body: "hi", edited: undefined, deleted: false, reactions: { "👍": 1, "🎉": 1 } },
  ]);
  ws.recv(msg("r", 8, { from: "alice", kind: "delete", ref: 1 }));
  assert.deepEqual(room.messages[0], { seq: 1, id: "m-1", from: "alice", ts: 1001, body: null, edited: 1003, deleted: true, reactions: {} });
  assert.equal(changes.length, 6);
  ws.recv(msg("r", 9, { kind: "edit", ref: 999, body: "x" })); // not in the view: ignored
  assert.equal(room.messages.length, 2);
});

test("kinds are checked before they are sent", async () => {
  const env = setup();
  const room = env.client.room("r");
  await open(env, "r");
  await assert.rejects(room.react(1, ""), (e) => e.code === "bad_request");
  await assert.rejects(room.react(1, "x".repeat(33)), (e) => e.code === "bad_request");
  await assert.rejects(room.edit(0, "x"), (e) => e.code === "bad_request");
  await assert.rejects(env.client.publish("r", "x", { kind: "shout", ref: 1 }), (e) => e.code === "bad_request");
  await assert.rejects(room.edit(1), (e) => e.code === "bad_request");
});

test("folded history enters the view; live changes apply on top", async () => {
  const env = setup();
  const room = env.client.room("r");
  const ws = await open(env, "r", { seq: 10 });
  const h = room.history({ fold: true, limit: 2 });
  await env.clock.advance(0);
  assert.deepEqual(ws.ops("history"), [{ op: "history", room: "r", limit: 2, fold: true }]);
  ws.recv({
    op: "history",
    room: "r",
    messages: [
      { seq: 4, id: "a", from: "bob", ts: 4, body: "edited", edited: 9, reactions: { "👍": 2 } },
      { seq: 6, id: "b", from: "bob", ts: 6, body: null, deleted: true },
    ],
  });
  await h;
  ws.recv(msg("r", 11, { from: "carol", kind: "react", ref: 4, body: "👍" }));
  assert.deepEqual(room.messages.map((m) => [m.seq, m.body, m.deleted, m.reactions]), [
    [4, "edited", false, { "👍": 3 }],
    [6, null, true, {}],
  ]);
});

test("over SSE: read events move the position, receipts events reach onReceipts (the stream asks receipts=true)", async () => {
  const ES = fakeEventSource();
  const env = setup({ transport: "sse", EventSource: ES });
  const reads = [];
  const receipts = [];
  const room = env.client.room("r", { onRead: (r) => reads.push(r.seq), onReceipts: (r) => receipts.push(r.read) });
  await env.clock.advance(0);
  const es = ES.last();
  assert.equal(es.query.get("receipts"), "true");
  es.open();
  es.event("joined", { op: "joined", room: "r", seq: 4, epoch: "E" });
  es.event("read", { op: "read", room: "r", seq: 3 });
  assert.equal(room.read, 3);
  assert.deepEqual(reads, [3]);
  es.event("receipts", { op: "receipts", room: "r", read: { bob: 4 } });
  assert.deepEqual(receipts, [{ bob: 4 }]);
});
