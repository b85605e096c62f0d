// The packed client as a user gets it: `npm pack` of client/, installed
// into a fresh project (no registry), imported by name and run on Node
// against a real roost node. Node 20 has no WebSocket of its own, so the
// app injects one: the `ws` package's, and undici's (the implementation
// Node 22 ships as its global WebSocket). Run by the repository's `go test`
// (test/client_test.go), which builds the binary:
//   ROOST_BIN=path/to/roost node --test test/pack.test.mjs
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const clientDir = path.resolve(here, "..");
const BIN = process.env.ROOST_BIN;
const skip = !BIN ? "ROOST_BIN is not set: run through go test (test/client_test.go)" : false;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

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

function run(cmd, args, opts) {
  const r = spawnSync(cmd, args, { encoding: "utf8", timeout: 120000, ...opts });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} exited ${r.status}:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

let tmp, project, node, port, tarball;

before(async () => {
  if (skip) return;
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "roost-pack-"));
  // npm pack prints the tarball's name last.
  const out = run("npm", ["pack", "--silent", "--pack-destination", tmp], { cwd: clientDir });
  tarball = path.join(tmp, out.trim().split("\n").pop());
  project = path.join(tmp, "app");
  fs.mkdirSync(project);
  fs.writeFileSync(path.join(project, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  // The tarball has no dependencies: --offline proves nothing is fetched.
  run("npm", ["install", "--offline", "--no-audit", "--no-fund", tarball], { cwd: project });

  port = await freePort();
  const admin = await freePort();
  node = spawn(BIN, ["serve", "--insecure", "--listen", `127.0.0.1:${port}`, "--admin", `127.0.0.1:${admin}`, "--api", "off", "--log-level", "error", "--loops", "1"], {
    stdio: ["ignore", "inherit", "inherit"],
    // The node refuses ROOST_ variables it does not know, such as ROOST_BIN.
    env: Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("ROOST_"))),
  });
  for (let i = 0; ; i++) {
    try {
      const res = await fetch(`http://127.0.0.1:${admin}/readyz`);
      if (res.ok) break;
    } catch {}
    if (i > 300) throw new Error("roost did not become ready");
    await sleep(50);
  }
});

after(() => {
  if (node) node.kill("SIGKILL");
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

// app writes a script into the fresh project, runs it with this Node, and
// returns what it printed as JSON.
function app(name, source) {
  const file = path.join(project, name);
  fs.writeFileSync(file, source);
  const out = run(process.execPath, [file], { cwd: project, env: { ...process.env, PORT: String(port) } });
  return JSON.parse(out.trim().split("\n").pop());
}

// chat is the script's body: join a room, publish, wait for the ack and
// for the message to come back, and print both.
const chat = (importWS, room) => `
import { Roost } from "roost-client";
${importWS}
const client = new Roost("ws://127.0.0.1:" + process.env.PORT + "/ws", { user: "alice", app: "packed", WebSocket });
let room, joined;
const isJoined = new Promise((resolve) => (joined = resolve));
const got = new Promise((resolve) => (room = client.room(${JSON.stringify(room)}, { onMessage: resolve, onJoined: joined })));
await isJoined; // published before the join is served, the message would come before the member's join point
const ack = await room.publish({ text: "hi" });
const msg = await got;
client.close();
console.log(JSON.stringify({ ack, msg }));
`;

test("the packed tarball holds the module, its types, its README and its licence", { skip }, () => {
  const list = run("tar", ["-tzf", tarball]).split("\n").filter(Boolean).sort();
  for (const f of ["package/package.json", "package/roost.js", "package/roost.d.ts", "package/README.md", "package/LICENSE"]) {
    assert.ok(list.includes(f), `${f} missing from the tarball: ${list.join(", ")}`);
  }
  const pkg = JSON.parse(fs.readFileSync(path.join(project, "node_modules", "roost-client", "package.json"), "utf8"));
  assert.equal(pkg.license, "Apache-2.0");
});

test("Node with the ws package's WebSocket: join, publish, ack, message", { skip }, () => {
  const wsPath = path.join(clientDir, "node_modules", "ws", "wrapper.mjs");
  const { ack, msg } = app("ws.mjs", chat(`import WebSocket from ${JSON.stringify(wsPath)};`, "packed-ws"));
  assert.equal(ack.room, "packed-ws");
  assert.equal(ack.seq, 1);
  assert.deepEqual(msg.body, { text: "hi" });
  assert.equal(msg.from, "alice");
  assert.equal(msg.seq, 1);
});

test("Node with undici's WebSocket (Node 22's global): join, publish, ack, message", { skip }, () => {
  const undiciPath = path.join(clientDir, "node_modules", "undici", "index.js");
  const { ack, msg } = app("undici.mjs", chat(`import { createRequire } from "node:module"; const { WebSocket } = createRequire(import.meta.url)(${JSON.stringify(undiciPath)});`, "packed-undici"));
  assert.equal(ack.seq, 1);
  assert.deepEqual(msg.body, { text: "hi" });
});

test("Node's own WebSocket where it has one; otherwise an error that says what to pass", { skip }, () => {
  const source = `
import { Roost } from "roost-client";
const client = new Roost("ws://127.0.0.1:" + process.env.PORT + "/ws", { user: "alice", app: "packed" });
if (typeof globalThis.WebSocket === "function") {
  const ack = await client.publish("packed-global", { text: "hi" });
  client.close();
  console.log(JSON.stringify({ global: true, seq: ack.seq }));
} else {
  while (!client.error) await new Promise((r) => setTimeout(r, 10));
  console.log(JSON.stringify({ global: false, code: client.error.code, message: client.error.message }));
}
`;
  const r = app("global.mjs", source);
  if (r.global) assert.equal(r.seq, 1);
  else {
    assert.equal(r.code, "unsupported");
    assert.match(r.message, /WebSocket/);
    assert.match(r.message, /ws/);
  }
});
