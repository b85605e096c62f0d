// Test doubles for the unit tests of roost.js: a WebSocket and an
// EventSource the test plays the node for, a clock the test advances, and a
// fetch that answers what the test says. The browser tests use the real
// browser against the real node.

export class FakeClock {
  constructor() {
    this.t = 1_700_000_000_000;
    this.timers = new Map();
    this.nextId = 1;
    this.setTimeout = (fn, ms) => {
      const id = this.nextId++;
      this.timers.set(id, { at: this.t + Math.max(0, ms || 0), fn, ms });
      return id;
    };
    this.clearTimeout = (id) => void this.timers.delete(id);
    this.now = () => this.t;
  }

  // advance runs every timer due within ms, in time order, letting the
  // client's promises settle after each.
  async advance(ms) {
    const end = this.t + ms;
    for (;;) {
      await flush();
      let next = null;
      for (const [id, tm] of this.timers) {
        if (tm.at <= end && (!next || tm.at < next[1].at || (tm.at === next[1].at && id < next[0]))) next = [id, tm];
      }
      if (!next) break;
      this.timers.delete(next[0]);
      this.t = Math.max(this.t, next[1].at);
      next[1].fn();
    }
    this.t = end;
    await flush();
  }

  // pending lists the delays of the timers still waiting, from now.
  pending() {
    return [...this.timers.values()].map((tm) => tm.at - this.t);
  }
}

export async function flush() {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
}

export function fakeWebSocket() {
  class FakeWS {
    constructor(url) {
      this.url = url;
      this.sent = [];
      this.readyState = 0;
      this.clientClosed = null;
      FakeWS.all.push(this);
    }
    send(s) {
      if (this.readyState !== 1) throw new Error("send on a socket that is not open");
      this.sent.push(JSON.parse(s));
    }
    close(code, reason) {
      this.clientClosed = { code, reason };
      this.readyState = 3;
    }
    // The node's side:
    open() {
      this.readyState = 1;
      this.onopen && this.onopen({});
    }
    recv(obj) {
      this.onmessage && this.onmessage({ data: typeof obj === "string" ? obj : JSON.stringify(obj) });
    }
    serverClose(code, reason = "") {
      this.readyState = 3;
      this.onclose && this.onclose({ code, reason });
    }
    ops(op) {
      return this.sent.filter((f) => f.op === op);
    }
    get query() {
      return new URL(this.url).searchParams;
    }
  }
  FakeWS.all = [];
  FakeWS.last = () => FakeWS.all[FakeWS.all.length - 1];
  return FakeWS;
}

export function fakeEventSource() {
  class FakeES {
    constructor(url) {
      this.url = url;
      this.readyState = 0;
      this.listeners = {};
      this.closed = false;
      FakeES.all.push(this);
    }
    addEventListener(type, fn) {
      (this.listeners[type] ||= []).push(fn);
    }
    close() {
      this.closed = true;
      this.readyState = 2;
    }
    open() {
      this.readyState = 1;
      this.onopen && this.onopen({});
    }
    event(type, obj) {
      for (const fn of this.listeners[type] || []) fn({ data: JSON.stringify(obj) });
    }
    fail(final) {
      this.readyState = final ? 2 : 0;
      this.onerror && this.onerror({});
    }
    get query() {
      return new URL(this.url).searchParams;
    }
  }
  FakeES.all = [];
  FakeES.last = () => FakeES.all[FakeES.all.length - 1];
  return FakeES;
}

// fakeFetch answers every request with respond(url) → {status, body} or
// throws (the node is unreachable) when respond returns null.
export function fakeFetch(respond) {
  const f = async (url) => {
    f.calls.push(url);
    const r = respond(url);
    if (!r) throw new TypeError("fetch failed");
    return { status: r.status, text: async () => r.body || "" };
  };
  f.calls = [];
  return f;
}

export function storage() {
  const m = new Map();
  return {
    m,
    getItem: (k) => (m.has(k) ? m.get(k) : null),
    setItem: (k, v) => void m.set(k, String(v)),
    removeItem: (k) => void m.delete(k),
  };
}

// seeded is a deterministic Math.random (mulberry32).
export function seeded(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function jwt(claims) {
  const enc = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  return `${enc({ alg: "HS256", typ: "JWT" })}.${enc(claims)}.sig`;
}
