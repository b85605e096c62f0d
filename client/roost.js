// roost.js: the browser client of a roost node. One ES module, no
// dependencies, no build step. It keeps the node's promise end to end:
// every room is resumed after a reconnect (and after a page reload) from
// the last message the app was given, every publish is re-sent under its
// same id until the node acknowledges it, and when the node says history
// was lost the app is told instead of being shown a silent gap.

export const VERSION = "1.0.0";

// Close codes of the protocol that the client reacts to.
const CLOSE_GOING_AWAY = 1001; // node draining
const CLOSE_POLICY = 1008; // token expired, app disabled, connection limit
const CLOSE_TRY_AGAIN = 1013; // slow consumer, overload, drain
const CLOSE_ABNORMAL = 1006; // no close frame: the browser's view of any failure

// Publish errors that say "not now" rather than "never": the entry stays in
// the outbox and is re-sent under its same id.
const RETRYABLE = new Set(["overloaded", "rate_limited"]);

const ROOM_RE = /^@?[A-Za-z0-9_.:-]{1,128}$/; // "@user": that user's inbox
const KINDS = new Set(["edit", "delete", "react", "unreact"]);
const SIGNAL_MAX = 1024; // bytes of a signal's body, as the node counts them
const UNREAD_MAX = 100; // rooms in one unread query

/** An error of the node (err frame, close, HTTP refusal) or of the client. */
export class RoostError extends Error {
  constructor(code, message, extra) {
    super(message);
    this.name = "RoostError";
    this.code = code;
    if (extra) Object.assign(this, extra);
  }
}

const defaults = {
  backoffMin: 500, // ms: full-jitter backoff between backoffMin and a window doubling per failure
  backoffMax: 20000, // ms: the window's cap
  stableAfter: 5000, // ms a connection must stay open before the backoff starts over
  connectTimeout: 10000, // ms for a WebSocket to open
  pingInterval: 25000, // ms of silence before the client checks the connection with a ping
  pongTimeout: 10000, // ms to wait for any frame after that ping
  requestTimeout: 30000, // ms a history or presence request may wait, reconnects included
  maxInFlight: 256, // publishes sent and not yet answered, per connection
  maxOutbox: 10000, // publishes held at most (the next one is refused: outbox_full)
  maxFrame: 65536, // bytes: the node's default frame limit; larger publishes are refused here
  refreshMargin: 5000, // ms before expiry by which a token refresh must have been sent
  persistOutbox: true, // keep unacknowledged publishes in storage too, so a reload re-sends them
  sse: false, // allow the listen-only Server-Sent Events fallback
  transport: "auto", // "auto": WebSocket (and the SSE fallback if allowed); "sse": listen-only, always SSE
  sseAfter: 2, // consecutive WebSocket failures with HTTP reachable before falling back
  wsProbeInterval: 30000, // ms, jittered: how often an SSE client tries WebSocket again
  signalRate: 10, // signals per second a room may send (the node's default), burst signalBurst
  signalBurst: 20,
  readEvery: 1000, // ms: markRead sends at most one read mark per room this often
  viewLimit: 1000, // messages a room's view keeps (the newest)
};

/**
 * A connection to a roost node that outlives sockets: rooms, positions and
 * the outbox belong to it; the WebSocket under it comes and goes.
 */
export class Roost {
  constructor(url, options = {}) {
    if (typeof url !== "string" || !/^wss?:\/\//.test(url)) {
      throw new TypeError("Roost: url must be a ws:// or wss:// URL of the node's /ws endpoint");
    }
    this.url = url;
    this.options = { ...defaults, ...options };
    const o = this.options;
    if (o.token === undefined && o.user === undefined) {
      throw new TypeError("Roost: give token (a string or a function returning one) or, on an insecure node, user");
    }
    this._WebSocket = o.WebSocket || globalThis.WebSocket;
    this._EventSource = o.EventSource || globalThis.EventSource;
    this._fetch = o.fetch || (globalThis.fetch ? globalThis.fetch.bind(globalThis) : null);
    this._random = o.random || Math.random;
    const clock = o.clock || {};
    this._setTimeout = clock.setTimeout || globalThis.setTimeout.bind(globalThis);
    this._clearTimeout = clock.clearTimeout || globalThis.clearTimeout.bind(globalThis);
    this._now = clock.now || Date.now;
    this._storage = pickStorage(o.storage);

    this.rooms = new Map(); // name -> Room
    this.error = null; // the error that stopped the client, if one did
    this._listeners = new Map();
    this._state = "connecting";
    this._transport = null; // "websocket" | "sse" while open
    this._closed = false;
    this._ws = null;
    this._es = null;
    this._everOpened = false;
    this._attempt = 0; // consecutive failed attempts
    this._wsBlocked = 0; // consecutive "HTTP works, WebSocket does not"
    this._sseWorked = false; // an SSE stream has opened for this client
    this._timer = null; // reconnect / probe
    this._connectTimer = null;
    this._pingTimer = null;
    this._refreshTimer = null;
    this._openedAt = 0;
    this._lastFrame = 0;
    this._pinged = false;
    this._authPending = null; // {token, exp}
    this._token = typeof o.token === "string" ? o.token : null;
    this._tokenExp = this._token ? tokenClaims(this._token).exp : undefined;
    this._tokenFresh = false; // the cached token came from the callback for this attempt
    this._scope = null;

    this._outbox = new Map(); // id -> entry, in publish order
    this._inFlight = 0;
    this._idPrefix = randomId(this._random);
    this._idSeq = 0;
    this._requests = []; // history / presence requests
    this._outboxLoaded = false; // the stored outbox has been read (needs the storage scope)
    this._slotHead = 0; // the stored outbox's slots in use: [head, tail)
    this._slotTail = 0;
    this._restoreOutbox();

    if (o.connect !== false) this._schedule(0, () => this._connect());
  }

  /** "connecting" | "open" | "reconnecting" | "closed" */
  get state() {
    return this._state;
  }

  /** "websocket" | "sse" while open, else null. */
  get transport() {
    return this._transport;
  }

  /** The publishes not yet acknowledged, oldest first. */
  get outbox() {
    return [...this._outbox.values()].map((e) => ({ id: e.id, room: e.room, body: e.body, sent: e.sent, restored: !!e.restored }));
  }

  /**
   * on("state"|"open"|"close"|"reconnect"|"error"|"reset"|"outbox"|"ack"|"nack"|"presence"|"message", fn) → a
   * function that removes the listener.
   */
  on(event, fn) {
    let set = this._listeners.get(event);
    if (!set) this._listeners.set(event, (set = new Set()));
    set.add(fn);
    return () => set.delete(fn);
  }

  off(event, fn) {
    const set = this._listeners.get(event);
    if (set) set.delete(fn);
  }

  /** The room named name: joined now and after every reconnect. */
  room(name, opts = {}) {
    if (!ROOM_RE.test(name)) throw new TypeError(`Roost: room name ${JSON.stringify(name)} must match [A-Za-z0-9_.:-]{1,128} (or @user for an inbox)`);
    if (this.rooms.has(name)) throw new Error(`Roost: room ${name} is already open; use client.rooms.get(${JSON.stringify(name)})`);
    if (this._closed) throw new RoostError("closed", "Roost: the client is closed");
    const r = new Room(this, name, opts);
    this.rooms.set(name, r);
    if (this._transport === "websocket") r._sendJoin();
    else if (this._transport === "sse") this._reopenSSE();
    return r;
  }

  /** This client's user: the user option, or the token's subject. */
  get user() {
    if (this.options.user !== undefined) return this.options.user;
    return this._token ? tokenClaims(this._token).sub : undefined;
  }

  /**
   * The user's own inbox, the room "@user": only this user may join it, and
   * only the app's backend writes to it. opts as for room().
   */
  inbox(opts = {}) {
    const user = this.user;
    if (user === undefined) throw new RoostError("bad_request", "Roost: the inbox needs the user: give user, or a token first");
    const name = "@" + user;
    return this.rooms.get(name) || this.room(name, opts);
  }

  /**
   * Unread counts of up to 100 rooms: resolves {room: {read, seq, count}}
   * (count: messages after the user's read position, edits, deletes and
   * reactions not counted). The rooms open here take the answer as their
   * unread count.
   */
  async unread(rooms) {
    if (!Array.isArray(rooms) || rooms.length === 0 || rooms.length > UNREAD_MAX) {
      throw new RoostError("bad_request", `Roost: unread takes 1 to ${UNREAD_MAX} room names`);
    }
    for (const r of rooms) if (!ROOM_RE.test(r)) throw new RoostError("bad_request", `Roost: room name ${JSON.stringify(r)} is not valid`);
    const answer = await this._request("unread", "", { op: "unread", rooms });
    const out = answer.rooms || {};
    for (const [name, u] of Object.entries(out)) {
      const r = this.rooms.get(name);
      if (r) r._setUnread(u);
    }
    return out;
  }

  /** Publish to a room without joining it (a publisher need not be a member). */
  publish(room, body, opts) {
    if (!ROOM_RE.test(room)) return Promise.reject(new RoostError("bad_request", `Roost: room name ${JSON.stringify(room)} must match [A-Za-z0-9_.:-]{1,128}`));
    return this._publish(room, body, opts);
  }

  /** Connect now (only needed with connect: false, or to cut a backoff short). */
  connect() {
    if (this._closed) throw new RoostError("closed", "Roost: the client is closed");
    if (this._ws || (this._es && this._transport === "sse")) return;
    this._clear("_timer");
    this._connect();
  }

  /**
   * Close for good: the promises of pending publishes and requests reject
   * with code "closed". The stored outbox stays for the next page of the
   * tab to re-send (a close on pagehide loses nothing), unless
   * discardOutbox: true forgets it (a logout).
   */
  close({ discardOutbox = false } = {}) {
    this._stop(null, discardOutbox);
  }

  // ---- connection -------------------------------------------------------

  async _connect(probe = false) {
    if (this._closed) return;
    if (!probe) this._setState(this._everOpened ? "reconnecting" : "connecting");
    if (this.options.transport === "sse") {
      // Listen-only by the app's choice: never a WebSocket.
      if (this._EventSource) this._openSSE();
      else this._stop(new RoostError("unsupported", "Roost: transport \"sse\" needs EventSource, which this environment lacks"));
      return;
    }
    if (!this._WebSocket) {
      if (this.options.sse && this._EventSource) this._openSSE();
      else this._stop(new RoostError("unsupported", "Roost: this environment has no WebSocket: pass one as the WebSocket option (on Node 20: import WebSocket from \"ws\"; Node 22+, Deno, Bun and browsers have their own), or allow the SSE fallback with sse: true where EventSource exists"));
      return;
    }
    let token;
    try {
      token = await this._getToken(false);
    } catch (err) {
      if (this._closed) return;
      this._emit("error", new RoostError("token_callback", `Roost: the token callback failed: ${err && err.message ? err.message : err}`, { cause: err }));
      this._afterFailure({});
      return;
    }
    if (this._closed) return;
    this._restoreOutbox(); // the token names the storage scope
    let ws;
    try {
      ws = new this._WebSocket(this._url(this.url, token));
    } catch (err) {
      this._stop(new RoostError("bad_url", `Roost: cannot open ${this.url}: ${err.message}`));
      return;
    }
    ws._probe = probe;
    this._ws = ws;
    ws.onopen = () => this._onOpen(ws);
    ws.onmessage = (ev) => this._onData(ws, ev.data);
    ws.onclose = (ev) => this._onClose(ws, ev.code, ev.reason || "");
    ws.onerror = () => {}; // a close event follows with the code
    this._clear("_connectTimer");
    this._connectTimer = this._setTimeout(() => {
      if (this._ws === ws && !ws._open) this._drop(ws, CLOSE_ABNORMAL, "connect timeout");
    }, this.options.connectTimeout);
  }

  _onOpen(ws) {
    if (this._ws !== ws) return;
    ws._open = true;
    this._clear("_connectTimer");
    if (this._es) this._closeSSE(); // a probe came through: WebSocket again
    this._clear("_timer");
    this._everOpened = true;
    this._wsBlocked = 0;
    this._openedAt = this._now();
    this._lastFrame = this._openedAt;
    this._transport = "websocket";
    for (const r of this.rooms.values()) r._sendJoin();
    for (const q of this._requests) q.sent = false;
    this._pumpRequests();
    this._pump();
    this._setState("open");
    this._emit("open", { transport: "websocket" });
    this._armPing();
    this._scheduleRefresh();
  }

  _onData(ws, data) {
    if (this._ws !== ws) return;
    this._lastFrame = this._now();
    this._pinged = false;
    let f;
    try {
      f = JSON.parse(data);
    } catch {
      this._emit("error", new RoostError("bad_frame", "Roost: the node sent a frame that is not JSON"));
      return;
    }
    this._frame(f);
  }

  _frame(f) {
    switch (f.op) {
      case "joined": {
        const r = this.rooms.get(f.room);
        if (r) r._onJoined(f);
        break;
      }
      case "msg": {
        const r = this.rooms.get(f.room);
        if (r) r._onMsg(f);
        break;
      }
      case "ack":
        this._onAck(f);
        break;
      case "err":
        this._onErr(f);
        break;
      case "left": {
        const r = this.rooms.get(f.room);
        if (r) r._joined = false;
        break;
      }
      case "history":
      case "presence":
        this._answer(f.op, f.room, f);
        break;
      case "unread":
        this._answer("unread", "", f);
        break;
      case "signal": {
        const r = this.rooms.get(f.room);
        if (!r || f.from === this.user) break; // the node sends a signal to the sender's other connections too
        const sig = { room: f.room, from: f.from, body: f.body };
        if (r._opts.onSignal) safeCall(r._opts.onSignal, sig);
        this._emit("signal", sig);
        break;
      }
      case "read": {
        const r = this.rooms.get(f.room);
        if (r && typeof f.seq === "number") r._onRead(f.seq);
        break;
      }
      case "receipts": {
        if (this._answer("receipts", f.room, f)) break;
        const r = this.rooms.get(f.room);
        const info = { room: f.room, read: f.read || {} };
        if (r && r._opts.onReceipts) safeCall(r._opts.onReceipts, info);
        this._emit("receipts", info);
        break;
      }
      case "presence_diff": {
        const r = this.rooms.get(f.room);
        if (r && r._opts.presence) r._presenceChange(Array.isArray(f.joined) ? f.joined : [], Array.isArray(f.left) ? f.left : [], false);
        break;
      }
      case "authed":
        if (this._authPending) {
          this._token = this._authPending.token;
          this._tokenExp = typeof f.exp === "number" ? f.exp : this._authPending.exp;
          this._authPending = null;
          this._scheduleRefresh();
        }
        break;
      case "pong":
        break;
    }
  }

  _onClose(ws, code, reason) {
    if (this._ws !== ws) return;
    this._ws = null;
    this._clear("_connectTimer");
    const wasOpen = !!ws._open;
    if (wasOpen) this._lostConnection();
    if (this._closed) return;
    const m = /^retry=(\d+)$/.exec(reason);
    const retry = m ? Number(m[1]) : null;
    this._emit("close", { code, reason, retry, wasOpen });
    if (ws._probe && !wasOpen && this._es) {
      // Still no WebSocket: stay on SSE and try again later.
      this._scheduleProbe();
      return;
    }
    if (wasOpen && this._now() - this._openedAt >= this.options.stableAfter) this._attempt = 0;
    if (code === CLOSE_POLICY) {
      if (reason === "token expired") {
        this._token = null; // the next attempt asks the callback
        this._afterFailure({});
        return;
      }
      if (reason !== "connection limit") {
        this._stop(new RoostError("policy", `Roost: the node closed the connection (1008 ${reason || "policy"})`, { closeCode: code }));
        return;
      }
    }
    if ((code === CLOSE_TRY_AGAIN || code === CLOSE_GOING_AWAY) && retry !== null) {
      // The node jitters its hint already: waiting exactly that long keeps
      // its spread.
      this._setState("reconnecting");
      this._reconnectIn(retry, "hint");
      return;
    }
    if (!wasOpen) {
      this._diagnose().then((d) => {
        if (!this._closed) this._afterFailure(d);
      });
      return;
    }
    this._afterFailure({});
  }

  // _lostConnection resets what belonged to the socket that just went.
  _lostConnection() {
    this._transport = null;
    this._clear("_pingTimer");
    this._clear("_refreshTimer");
    this._authPending = null;
    for (const r of this.rooms.values()) {
      r._joined = false;
      r._joining = false;
      r._presenceOff = false;
    }
    for (const e of this._outbox.values()) {
      this._clearEntryTimer(e); // a reconnect is the pause a "not now" asked for
      if (e.sent) {
        e.sent = false;
        this._inFlight--;
      }
    }
    for (const q of this._requests) q.sent = false;
    if (this._outbox.size) this._emit("outbox", this.outbox);
  }

  // _drop gives up on a socket without waiting for the browser's close
  // handshake (a dead peer would keep it waiting for minutes).
  _drop(ws, code, reason) {
    ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    try {
      ws.close();
    } catch {
      // already closing
    }
    this._onClose(ws, code, reason);
  }

  // _diagnose asks the node over plain HTTP why a WebSocket did not open:
  // a browser hides the refusal (401 and its reason) behind code 1006.
  async _diagnose() {
    if (!this._fetch) return {};
    let token = this._token;
    if (this.options.user === undefined && !token) return {};
    let res, text;
    try {
      res = await this._fetch(this._url(httpURL(this.url), token), { cache: "no-store", credentials: "omit" });
      text = (await res.text()).trim();
    } catch {
      return {}; // unreachable: the node is down or the network is
    }
    if (res.status === 426) return { blocked: true }; // HTTP reaches the node; WebSocket does not
    if (res.status === 401 || res.status === 403 || res.status === 400) {
      return { refused: new RoostError(res.status === 400 ? "bad_request" : "unauthorized", `Roost: the node refused the connection (${res.status} ${text})`, { status: res.status }) };
    }
    if (res.status === 404) {
      return { refused: new RoostError("not_found", `Roost: no roost WebSocket endpoint at ${this.url} (404 ${text})`, { status: 404 }) };
    }
    return {};
  }

  // _afterFailure decides what follows a failed or lost connection.
  _afterFailure(d) {
    if (this._closed) return;
    if (d.refused) {
      if (!this._tokenFresh && typeof this.options.token === "function" && d.refused.code === "unauthorized") {
        // The refused token was a cached one: one more try with a new one.
        this._token = null;
        this._schedule(0, () => this._connect());
        return;
      }
      this._stop(d.refused);
      return;
    }
    this._wsBlocked = d.blocked ? this._wsBlocked + 1 : 0;
    // Once SSE has served this client, one more blocked WebSocket is proof
    // enough (the path did not change): back to SSE without the wait.
    const after = this._sseWorked ? 1 : this.options.sseAfter;
    if (this.options.sse && this._EventSource && this._wsBlocked >= after) {
      this._openSSE();
      return;
    }
    this._setState(this._everOpened ? "reconnecting" : "connecting");
    this._reconnectIn(this._backoff(), "backoff");
  }

  // _backoff is full jitter: uniform between backoffMin and a window that
  // doubles with each consecutive failure up to backoffMax, so a crowd that
  // lost the same node comes back spread out.
  _backoff() {
    const { backoffMin: lo, backoffMax: hi } = this.options;
    const win = Math.min(hi, lo * 2 ** (this._attempt + 1));
    this._attempt++;
    return Math.round(lo + this._random() * (win - lo));
  }

  // _reconnectIn schedules the next attempt and says when (an app can show
  // "reconnecting in 3 s").
  _reconnectIn(wait, why) {
    this._schedule(wait, () => this._connect());
    this._emit("reconnect", { wait, attempt: this._attempt, why });
  }

  _stop(err, discardOutbox = false) {
    if (this._closed) return;
    this._closed = true;
    this.error = err;
    for (const k of ["_timer", "_connectTimer", "_pingTimer", "_refreshTimer"]) this._clear(k);
    const ws = this._ws;
    this._ws = null;
    if (ws) {
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
      try {
        ws.close(1000, err ? "error" : "bye");
      } catch {
        // already closing
      }
    }
    this._closeSSE();
    this._transport = null;
    const reason = err || new RoostError("closed", "Roost: the client was closed");
    // The promises settle (this client will not re-send), saying the
    // publish may not be stored; the stored entries stay for the next page
    // of the tab, which re-sends them under their ids, unless the app
    // discards them: then each is a nack.
    const n = this._outbox.size;
    const entries = [...this._outbox.values()];
    if (discardOutbox) for (const e of entries) this._settle(e, null, reason, false);
    else {
      this._outbox.clear();
      for (const e of entries) {
        this._clearEntryTimer(e);
        if (e.reject) e.reject(reason);
      }
    }
    this._inFlight = 0;
    if (n) this._emit("outbox", []);
    for (const q of this._requests.splice(0)) {
      this._clearTimer(q.timer);
      q.reject(reason);
    }
    this._setState("closed");
    if (err) this._emit("error", err);
  }

  _url(base, token) {
    const u = new URL(base);
    const o = this.options;
    if (token) u.searchParams.set("token", token);
    else {
      u.searchParams.set("user", o.user);
      if (o.app !== undefined) u.searchParams.set("app", o.app);
    }
    return u.toString();
  }

  // ---- token ------------------------------------------------------------

  async _getToken(fresh) {
    const o = this.options;
    this._tokenFresh = false;
    if (o.token === undefined) return null;
    if (typeof o.token === "string") return o.token;
    const left = this._tokenExp !== undefined ? this._tokenExp * 1000 - this._now() : Infinity;
    if (!fresh && this._token && left > 2 * o.refreshMargin) return this._token;
    const t = await o.token();
    if (typeof t !== "string" || !t) throw new Error("the token callback returned no token");
    this._token = t;
    this._tokenExp = tokenClaims(t).exp;
    this._tokenFresh = true;
    return t;
  }

  // _scheduleRefresh puts the next refresh at a random point between 60%
  // and 85% of the token's remaining life (never later than refreshMargin
  // before expiry), so that clients given tokens at the same moment do not
  // all ask the backend in the same second.
  _scheduleRefresh() {
    this._clear("_refreshTimer");
    if (typeof this.options.token !== "function" || this._tokenExp === undefined) return;
    const left = this._tokenExp * 1000 - this._now();
    if (left <= 0) return;
    const at = Math.max(0, Math.min(left * (0.6 + 0.25 * this._random()), left - this.options.refreshMargin));
    this._refreshTimer = this._setTimeout(() => this._refresh(), at);
  }

  async _refresh() {
    this._refreshTimer = null;
    let t;
    try {
      t = await this._getToken(true);
    } catch (err) {
      if (this._closed) return;
      this._emit("error", new RoostError("token_callback", `Roost: the token callback failed: ${err && err.message ? err.message : err}`, { cause: err }));
      // Try again soon; the node closes with 1008 token expired if we never
      // manage, and the reconnect asks the callback again.
      this._refreshTimer = this._setTimeout(() => this._refresh(), Math.min(this._backoffDelayOnly(), 5000));
      return;
    }
    if (this._closed) return;
    if (this._transport === "sse") {
      this._reopenSSE(); // an EventSource cannot change its token: open a new one
      this._scheduleRefresh();
      return;
    }
    if (this._transport !== "websocket") return; // the reconnect uses the new token
    this._authPending = { token: t, exp: this._tokenExp };
    this._send({ op: "auth", token: t });
  }

  _backoffDelayOnly() {
    const { backoffMin: lo } = this.options;
    return Math.round(lo + this._random() * lo);
  }

  // ---- frames out -------------------------------------------------------

  _send(obj) {
    const ws = this._ws;
    if (!ws || !ws._open) return false;
    try {
      ws.send(typeof obj === "string" ? obj : JSON.stringify(obj));
      return true;
    } catch {
      return false;
    }
  }

  _armPing() {
    this._clear("_pingTimer");
    const o = this.options;
    if (!o.pingInterval) return;
    const tick = () => {
      const ws = this._ws;
      if (!ws || !ws._open) return;
      const silent = this._now() - this._lastFrame;
      if (this._pinged && silent >= o.pingInterval + o.pongTimeout) {
        this._drop(ws, CLOSE_ABNORMAL, "no answer to ping");
        return;
      }
      if (!this._pinged && silent >= o.pingInterval) {
        this._pinged = true;
        this._send({ op: "ping" });
      }
      const next = this._pinged ? o.pingInterval + o.pongTimeout - silent : o.pingInterval - silent;
      this._pingTimer = this._setTimeout(tick, Math.max(10, next));
    };
    this._pingTimer = this._setTimeout(tick, o.pingInterval);
  }

  // ---- outbox -----------------------------------------------------------

  _publish(room, body, opts = {}) {
    if (this._closed) return Promise.reject(this.error || new RoostError("closed", "Roost: the client is closed"));
    const id = opts.id !== undefined ? String(opts.id) : `${this._idPrefix}-${(++this._idSeq).toString(36)}`;
    if (id.length < 1 || id.length > 64) return Promise.reject(new RoostError("bad_request", "Roost: a publish id is 1 to 64 characters"));
    const same = this._outbox.get(id);
    if (same) return entryPromise(same);
    const kind = opts.kind;
    if (kind !== undefined && !KINDS.has(kind)) return Promise.reject(new RoostError("bad_request", `Roost: kind ${JSON.stringify(kind)} is not edit, delete, react or unreact`));
    if (kind !== undefined && !(Number.isInteger(opts.ref) && opts.ref > 0)) return Promise.reject(new RoostError("bad_request", "Roost: an edit, delete or reaction needs ref, the seq of a message"));
    if (body === undefined && kind !== "delete") return Promise.reject(new RoostError("bad_request", "Roost: publish needs a body (any JSON value)"));
    if ((kind === "react" || kind === "unreact") && !(typeof body === "string" && utf8Length(body) >= 1 && utf8Length(body) <= 32)) {
      return Promise.reject(new RoostError("bad_request", "Roost: a reaction is a string of 1 to 32 bytes"));
    }
    let frame;
    try {
      const f = { op: "pub", room, id };
      if (kind !== undefined) Object.assign(f, { kind, ref: opts.ref });
      if (body !== undefined) f.body = body;
      frame = JSON.stringify(f);
    } catch (err) {
      return Promise.reject(new RoostError("bad_request", `Roost: the body is not JSON: ${err.message}`));
    }
    if (utf8Length(frame) > this.options.maxFrame) {
      return Promise.reject(new RoostError("too_large", `Roost: the publish is larger than maxFrame (${this.options.maxFrame} bytes)`));
    }
    if (this._outbox.size >= this.options.maxOutbox) {
      return Promise.reject(new RoostError("outbox_full", `Roost: ${this._outbox.size} publishes are waiting already (maxOutbox)`));
    }
    const e = { id, room, body, frame, sent: false, tries: 0, timer: null, restored: false, promise: null };
    this._outbox.set(id, e);
    // Stored before it can be sent: a reload from here on re-sends it.
    this._storeEntry(e);
    this._pump();
    this._emit("outbox", this.outbox);
    return entryPromise(e);
  }

  // ---- the outbox in storage ----------------------------------------------
  //
  // Each entry is its own key, in a numbered slot (its frame), and one key
  // holds the range of slots in use, "head,tail": a publish writes its
  // slot and the tail, an ack removes its slot and moves the head past
  // what is gone, so neither rewrites the other entries (a big outbox stays
  // cheap). The keys are scoped like positions (node, app, user), so a
  // reload, the same user again, re-sends them under their ids and the
  // node stores each once.

  _outboxStorage() {
    if (!this._storage || !this.options.persistOutbox) return null;
    const o = this.options;
    // In token mode the scope is the token's app and user: unknown before
    // the first token.
    if (!o.storageKey && o.token !== undefined && !this._token) return null;
    return this._storage;
  }

  _outboxKey(suffix) {
    return this._storageKey("#outbox") + suffix;
  }

  _writeRange(st) {
    try {
      if (this._slotHead === this._slotTail) {
        this._slotHead = this._slotTail = 0;
        st.removeItem(this._outboxKey(""));
      } else st.setItem(this._outboxKey(""), `${this._slotHead},${this._slotTail}`);
    } catch {
      // full or unavailable: the outbox then lives in the page only
    }
  }

  // _slotEntry stores e in the next slot; false when storage is full.
  _slotEntry(st, e) {
    const slot = this._slotTail;
    try {
      st.setItem(this._outboxKey(":" + slot), e.frame);
    } catch (err) {
      // Full (sessionStorage holds about 5 MB): this entry lives in the
      // page only, and the app is told.
      this._emit("error", new RoostError("storage", `Roost: publish ${e.id} could not be stored (${err && err.name ? err.name : err}): a reload before its ack loses it`, { ref: e.id }));
      return false;
    }
    e.slot = slot;
    this._slotTail = slot + 1;
    return true;
  }

  _storeEntry(e) {
    const st = this._outboxLoaded && this._outboxStorage();
    if (st && this._slotEntry(st, e)) this._writeRange(st);
  }

  _unstoreEntry(e) {
    if (e.slot === undefined) return;
    const st = this._outboxLoaded && this._outboxStorage();
    if (!st) return;
    try {
      st.removeItem(this._outboxKey(":" + e.slot));
    } catch {
      // unavailable
    }
    // The head is the oldest slot still held (entries are in slot order).
    let head = this._slotTail;
    for (const x of this._outbox.values()) {
      if (x.slot !== undefined) {
        head = x.slot;
        break;
      }
    }
    if (head !== this._slotHead) {
      this._slotHead = head;
      this._writeRange(st);
    }
  }

  // _restoreOutbox reads what an earlier page of this tab left unacknowledged
  // (once, as soon as the scope is known) and puts it ahead of this page's
  // own publishes, which it then stores too.
  _restoreOutbox() {
    if (this._outboxLoaded) return;
    const st = this._outboxStorage();
    if (!st) {
      if (!this._storage || !this.options.persistOutbox) this._outboxLoaded = true;
      return;
    }
    this._outboxLoaded = true;
    const mine = [...this._outbox.values()];
    const restored = [];
    this._slotHead = this._slotTail = 0;
    try {
      const m = /^(\d+),(\d+)$/.exec(st.getItem(this._outboxKey("")) || "");
      const head = m ? Number(m[1]) : 0;
      const tail = m ? Number(m[2]) : 0;
      const seen = new Set();
      for (let slot = head; slot < tail; slot++) {
        const frame = st.getItem(this._outboxKey(":" + slot));
        if (!frame) continue; // acknowledged
        let f;
        try {
          f = JSON.parse(frame);
        } catch {
          f = null;
        }
        if (!f || f.op !== "pub" || typeof f.id !== "string" || typeof f.room !== "string" || seen.has(f.id) || this._outbox.has(f.id)) {
          st.removeItem(this._outboxKey(":" + slot));
          continue;
        }
        seen.add(f.id);
        restored.push({ id: f.id, room: f.room, body: f.body, frame, sent: false, tries: 0, timer: null, restored: true, promise: null, slot });
      }
      if (restored.length) {
        this._slotHead = restored[0].slot;
        this._slotTail = tail;
      }
    } catch {
      // unreadable: nothing to restore
    }
    if (!restored.length && !mine.length) {
      this._writeRange(st);
      return;
    }
    this._outbox.clear();
    for (const e of restored) this._outbox.set(e.id, e);
    for (const e of mine) this._outbox.set(e.id, e);
    if (!restored.length) this._slotHead = this._slotTail;
    for (const e of mine) this._slotEntry(st, e);
    this._writeRange(st);
    if (restored.length) {
      this._pump();
      this._emit("outbox", this.outbox);
    }
  }

  _pump() {
    if (this._transport !== "websocket") return;
    for (const e of this._outbox.values()) {
      if (this._inFlight >= this.options.maxInFlight) break;
      if (e.sent || e.timer) continue;
      if (!this._send(e.frame)) break;
      e.sent = true;
      e.tries++;
      this._inFlight++;
    }
  }

  _onAck(f) {
    const e = this._outbox.get(f.id);
    if (!e || e.room !== f.room) return; // an ack of a re-send already settled
    this._settle(e, { seq: f.seq, id: f.id, room: f.room }, null);
  }

  // _settle ends an entry: acknowledged (ack) or refused for good (err).
  // Its promise, if this page made one, settles; the ack and nack events
  // and the room's onAck / onNack tell every page, a reloaded one included.
  _settle(e, ack, err, pump = true) {
    this._outbox.delete(e.id);
    this._clearEntryTimer(e);
    if (e.sent) this._inFlight--;
    this._unstoreEntry(e);
    const r = this.rooms.get(e.room);
    if (ack) {
      if (r) r._onRead(ack.seq); // the node moves the user's read position to its own publish
      if (e.resolve) e.resolve(ack);
      const info = { ...ack, body: e.body, restored: e.restored };
      if (r && r._opts.onAck) safeCall(r._opts.onAck, info);
      this._emit("ack", info);
    } else {
      if (e.reject) e.reject(err);
      const info = { id: e.id, room: e.room, body: e.body, restored: e.restored, error: err };
      if (r && r._opts.onNack) safeCall(r._opts.onNack, info);
      this._emit("nack", info);
    }
    if (pump) {
      this._pump();
      this._emit("outbox", this.outbox);
    }
  }

  _clearEntryTimer(e) {
    if (e.timer) {
      this._clearTimer(e.timer);
      e.timer = null;
    }
  }

  _onErr(f) {
    const err = new RoostError(f.code || "internal", f.message || f.code || "error", { ref: f.ref });
    const e = f.ref !== undefined ? this._outbox.get(f.ref) : undefined;
    if (e && e.sent) {
      if (RETRYABLE.has(err.code)) {
        // The node said not now: send it again after a pause (and at once
        // after a reconnect).
        e.sent = false;
        this._inFlight--;
        const lo = this.options.backoffMin;
        const delay = Math.round(lo / 5 + this._random() * Math.min(this.options.backoffMax, lo * 2 ** Math.min(e.tries, 6)));
        e.timer = this._setTimeout(() => {
          e.timer = null;
          this._pump();
        }, delay);
        this._pump();
        return;
      }
      this._settle(e, null, err);
      return;
    }
    const r = f.ref !== undefined ? this.rooms.get(f.ref) : undefined;
    if (r && r._joining) {
      r._onJoinErr(err);
      return;
    }
    if (r && this._failRequest(r.name, err)) return;
    if (this._authPending && err.code === "forbidden") {
      this._stop(new RoostError("token_refused", `Roost: the node refused the refreshed token: ${err.message}`));
      return;
    }
    this._emit("error", err);
  }

  // ---- history and presence requests -------------------------------------

  _request(op, room, frame) {
    if (this._closed) return Promise.reject(this.error || new RoostError("closed", "Roost: the client is closed"));
    return new Promise((resolve, reject) => {
      const q = { op, room, frame: JSON.stringify(frame), sent: false, resolve, reject };
      q.timer = this._setTimeout(() => {
        this._requests = this._requests.filter((x) => x !== q);
        reject(new RoostError("timeout", `Roost: no answer to ${op} of ${room} within ${this.options.requestTimeout} ms`));
      }, this.options.requestTimeout);
      this._requests.push(q);
      this._pumpRequests();
    });
  }

  _pumpRequests() {
    if (this._transport !== "websocket") return;
    for (const q of this._requests) {
      if (!q.sent && this._send(q.frame)) q.sent = true;
    }
  }

  _answer(op, room, f) {
    const i = this._requests.findIndex((q) => q.sent && q.op === op && q.room === room);
    if (i < 0) return false;
    const [q] = this._requests.splice(i, 1);
    this._clearTimer(q.timer);
    const { op: _op, ...rest } = f;
    q.resolve(rest);
    return true;
  }

  _failRequest(room, err) {
    const i = this._requests.findIndex((q) => q.sent && q.room === room);
    if (i < 0) return false;
    const [q] = this._requests.splice(i, 1);
    this._clearTimer(q.timer);
    q.reject(err);
    return true;
  }

  // ---- Server-Sent Events (listen-only) -----------------------------------

  async _openSSE() {
    if (this._closed) return;
    let token;
    try {
      token = await this._getToken(false);
    } catch (err) {
      this._emit("error", new RoostError("token_callback", `Roost: the token callback failed: ${err && err.message ? err.message : err}`, { cause: err }));
      this._wsBlocked = 0;
      this._afterFailure({});
      return;
    }
    if (this._closed) return;
    this._closeSSE();
    const u = new URL(this._url(httpURL(this.url).replace(/\/ws(\?|$)/, "/sse$1"), token));
    const since = [];
    let receipts = false;
    for (const r of this.rooms.values()) {
      u.searchParams.append("room", r.name);
      if (r._opts.receipts || r._opts.onReceipts) receipts = true;
      const p = r._position();
      if (p) since.push(`${r.name}:${p.seq}`);
      r._sentSince = p ? p.seq : undefined;
      r._joining = true;
    }
    if (since.length) u.searchParams.set("since", since.join(","));
    if (receipts) u.searchParams.set("receipts", "true"); // the stream's rooms all get them: rooms without onReceipts ignore them
    const es = new this._EventSource(u.toString());
    this._es = es;
    const data = (ev) => {
      try {
        return JSON.parse(ev.data);
      } catch {
        return null;
      }
    };
    // Each event's data is the WebSocket frame of its name.
    for (const op of ["joined", "msg", "err", "signal", "read", "receipts"]) {
      es.addEventListener(op, (ev) => {
        const f = data(ev);
        if (this._es === es && f) this._frame({ ...f, op });
      });
    }
    es.onopen = () => {
      if (this._es !== es) return;
      this._everOpened = true;
      this._sseWorked = true;
      this._attempt = 0;
      this._transport = "sse";
      this._setState("open");
      this._emit("open", { transport: "sse" });
      this._scheduleRefresh();
      this._scheduleProbe();
    };
    es.onerror = () => {
      if (this._es !== es) return;
      const wasOpen = this._transport === "sse";
      this._transport = null;
      for (const r of this.rooms.values()) {
        r._joined = false;
        r._joining = true;
        r._sentSince = r._last; // the browser resumes from its Last-Event-ID: our position
      }
      if (es.readyState === 2) {
        // The browser gave up (an HTTP error): back to WebSocket first.
        this._closeSSE();
        this._emit("close", { code: CLOSE_ABNORMAL, reason: "sse failed", retry: null, wasOpen });
        this._wsBlocked = 0;
        this._setState("reconnecting");
        this._reconnectIn(this._backoff(), "backoff");
        return;
      }
      this._setState("reconnecting"); // the browser reconnects by itself
    };
  }

  _reopenSSE() {
    if (this._es) this._openSSE();
  }

  _closeSSE() {
    const es = this._es;
    if (!es) return;
    this._es = null;
    if (this._transport === "sse") this._transport = null;
    es.onopen = es.onerror = null;
    try {
      es.close();
    } catch {
      // gone
    }
  }

  _scheduleProbe() {
    if (this.options.transport === "sse") return;
    const base = this.options.wsProbeInterval;
    this._schedule(Math.round(base / 2 + this._random() * base), () => {
      if (this._es && !this._ws) this._connect(true);
    });
  }

  // ---- helpers ----------------------------------------------------------

  _schedule(ms, fn) {
    this._clear("_timer");
    this._timer = this._setTimeout(() => {
      this._timer = null;
      fn();
    }, ms);
  }

  _clear(key) {
    if (this[key]) {
      this._clearTimer(this[key]);
      this[key] = null;
    }
  }

  _clearTimer(t) {
    if (t) this._clearTimeout(t);
  }

  _setState(s) {
    if (this._state === s || (this._state === "closed" && s !== "closed")) return;
    this._state = s;
    this._emit("state", s);
  }

  _emit(event, arg) {
    const set = this._listeners.get(event);
    if (!set) return;
    for (const fn of [...set]) safeCall(fn, arg);
  }

  // _storageKey scopes positions by node, app and user, so two clients in
  // one tab (or two users of one browser) never share them.
  _storageKey(room) {
    if (!this._scope) {
      const o = this.options;
      let who = o.storageKey;
      if (!who) {
        if (o.user !== undefined && o.token === undefined) who = `${o.app || "demo"}/${o.user}`;
        else {
          const c = this._token ? tokenClaims(this._token) : {};
          who = `${c.app || ""}/${c.sub || ""}`;
        }
      }
      const u = new URL(this.url);
      this._scope = `roost:v1:${u.host}${u.pathname}:${who}`;
    }
    return `${this._scope}:${room}`;
  }
}

/** One room of a client. */
class Room {
  constructor(client, name, opts) {
    this.client = client;
    this.name = name;
    this._opts = opts;
    this._last = undefined; // seq of the last message given to onMessage
    this._epoch = undefined;
    this._loaded = false;
    this._joined = false;
    this._joining = false;
    this._sentSince = undefined;
    this._failed = null;
    this._members = new Set(); // with presence: the users here, as last known
    this._snapshot = 0; // the presence snapshot being asked for (a counter: only the newest counts)
    this._touched = null; // users named by diffs while a snapshot is on its way
    this._presenceOff = false; // the node refused presence on this connection (its limit)
    this._read = undefined; // the user's read position, as last known
    this._unreadBase = null; // {upto, count}: the node's count of unread messages up to seq upto
    this._unreadSeqs = []; // countable messages of others after max(read, upto), seen live
    this._markWant = 0; // the highest seq markRead was asked for
    this._markSent = 0;
    this._unreadAsking = false; // an unread request of _settleBase awaits its answer
    this._markTimer = null;
    this._signalTokens = client.options.signalBurst;
    this._signalAt = client._now();
    this._view = new Map(); // seq -> message as it stands (edits, deletes, reactions applied)
  }

  /** The user's read position in the room, as last known (undefined before any). */
  get read() {
    return this._read;
  }

  /**
   * Unread messages: after the read position, not the user's own, edits,
   * deletes and reactions not counted. From the node's count (client.unread)
   * and the messages seen since.
   */
  get unread() {
    return (this._unreadBase ? this._unreadBase.count : 0) + this._unreadSeqs.length;
  }

  /**
   * The room's messages as they stand, oldest first: each {seq, id, from,
   * ts, body, edited?, deleted?, reactions}, edits, deletes and reactions
   * applied in order as they arrived (at most viewLimit, the newest).
   */
  get messages() {
    return [...this._view.values()].sort((a, b) => a.seq - b.seq);
  }

  /**
   * Send a signal (typing, a cursor) to the room's other members: never
   * stored, at most once. Returns false when it was not sent (no open
   * connection, or over the room's signal rate here); throws a RoostError
   * for a body over 1 KiB.
   */
  signal(body) {
    const c = this.client;
    let text;
    try {
      text = JSON.stringify(body);
    } catch (err) {
      throw new RoostError("bad_request", `Roost: the signal is not JSON: ${err.message}`);
    }
    if (text === undefined) throw new RoostError("bad_request", "Roost: a signal needs a body (any JSON value)");
    if (utf8Length(text) > SIGNAL_MAX) throw new RoostError("too_large", `Roost: a signal's body is at most ${SIGNAL_MAX} bytes`);
    const now = c._now();
    this._signalTokens = Math.min(c.options.signalBurst, this._signalTokens + ((now - this._signalAt) / 1000) * c.options.signalRate);
    this._signalAt = now;
    if (this._signalTokens < 1 || c._transport !== "websocket" || !this._joined) return false;
    if (!c._send({ op: "signal", room: this.name, body })) return false;
    this._signalTokens--;
    return true;
  }

  /**
   * Mark the room read up to seq (call it with the newest message shown).
   * Marks are coalesced: at most one is sent per readEvery ms, the highest.
   */
  markRead(seq) {
    if (!Number.isInteger(seq) || seq < 0) throw new RoostError("bad_request", "Roost: markRead takes a message's seq");
    if (seq <= this._markWant || (this._read !== undefined && seq <= this._read)) return;
    this._markWant = seq;
    this._onRead(seq, true);
    if (!this._markTimer) this._sendMark();
  }

  _sendMark() {
    const c = this.client;
    this._markTimer = null;
    if (this._markWant <= this._markSent) return;
    if (c._transport !== "websocket" || !c._send({ op: "read", room: this.name, seq: this._markWant })) {
      // Sent after the next join (see _onJoined).
      return;
    }
    this._markSent = this._markWant;
    this._markTimer = c._setTimeout(() => this._sendMark(), c.options.readEvery);
  }

  /** Every user's read position in the room: resolves {room, read: {user: seq}, more?}. */
  receipts() {
    return this.client._request("receipts", this.name, { op: "receipts", room: this.name });
  }

  /** Replace the body of message seq (the sender's own, or any through the server API). */
  edit(seq, body, opts) {
    return this.client._publish(this.name, body, { ...opts, kind: "edit", ref: seq });
  }

  /** Delete message seq (the sender's own). */
  delete(seq, opts) {
    return this.client._publish(this.name, undefined, { ...opts, kind: "delete", ref: seq });
  }

  /** React to message seq with a string of 1 to 32 bytes, e.g. "👍". */
  react(seq, reaction, opts) {
    return this.client._publish(this.name, reaction, { ...opts, kind: "react", ref: seq });
  }

  /** Take back a reaction. */
  unreact(seq, reaction, opts) {
    return this.client._publish(this.name, reaction, { ...opts, kind: "unreact", ref: seq });
  }

  /**
   * With presence: true, the users in the room as last known (each join
   * asks the node again), sorted; undefined without presence.
   */
  get members() {
    return this._opts.presence ? [...this._members].sort() : undefined;
  }

  /** seq of the last message given to onMessage (undefined before the first join). */
  get seq() {
    this._load();
    return this._last;
  }

  get epoch() {
    this._load();
    return this._epoch;
  }

  get joined() {
    return this._joined;
  }

  /** Publish body (any JSON value). Resolves {seq, id, room} once stored; rejects with a RoostError {code, message}. */
  publish(body, opts) {
    return this.client._publish(this.name, body, opts);
  }

  /**
   * Older messages: resolves {room, messages, more}. With fold: true, only
   * messages, each as it stands now (edited, deleted, reactions), which also
   * enter the room's view.
   */
  async history({ before, after, limit = 50, fold = false } = {}) {
    const f = { op: "history", room: this.name, limit };
    if (before !== undefined) f.before = before;
    if (after !== undefined) f.after = after;
    if (fold) f.fold = true;
    const h = await this.client._request("history", this.name, f);
    if (fold && Array.isArray(h.messages)) {
      for (const m of h.messages) {
        if (typeof m.seq !== "number" || this._view.has(m.seq)) continue;
        this._view.set(m.seq, { seq: m.seq, id: m.id, from: m.from, ts: m.ts, body: m.body, edited: m.edited, deleted: m.deleted === true, reactions: { ...(m.reactions || {}) } });
      }
      this._trimView();
    }
    return h;
  }

  /** Who is here: resolves {room, count, users, more}. */
  presence() {
    return this.client._request("presence", this.name, { op: "presence", room: this.name });
  }

  /** Leave the room: no more messages, its position is forgotten. */
  leave() {
    const c = this.client;
    if (c.rooms.get(this.name) !== this) return;
    c.rooms.delete(this.name);
    if (this._markTimer) c._clearTimer(this._markTimer);
    this._markTimer = null;
    if (c._transport === "websocket") c._send({ op: "leave", room: this.name });
    else if (c._transport === "sse" || c._es) c._reopenSSE();
    if (c._storage) {
      try {
        c._storage.removeItem(c._storageKey(this.name));
      } catch {
        // storage unavailable
      }
    }
  }

  _load() {
    if (this._loaded) return;
    const c = this.client;
    if (!c._storage || this._opts.resume === false) {
      this._loaded = true;
      return;
    }
    if (c.options.token !== undefined && !c._token && !c.options.storageKey) return; // scope not known yet
    this._loaded = true;
    try {
      const v = c._storage.getItem(c._storageKey(this.name));
      if (v) {
        const p = JSON.parse(v);
        if (typeof p.s === "number") {
          this._last = p.s;
          this._epoch = typeof p.e === "string" ? p.e : undefined;
        }
      }
    } catch {
      // unreadable: start without
    }
  }

  _save() {
    const c = this.client;
    if (!c._storage || this._last === undefined) return;
    try {
      const p = { s: this._last };
      if (this._epoch !== undefined) p.e = this._epoch;
      c._storage.setItem(c._storageKey(this.name), JSON.stringify(p));
    } catch {
      // full or unavailable: positions then live in memory only
    }
  }

  // _position is where a (re)join resumes from, if anywhere.
  _position() {
    this._load();
    if (this._last !== undefined) return { seq: this._last, epoch: this._epoch };
    if (typeof this._opts.since === "number") return { seq: this._opts.since, epoch: undefined };
    return null;
  }

  _sendJoin() {
    if (this._failed) return;
    const f = { op: "join", room: this.name };
    const p = this._position();
    if (p) {
      f.since = p.seq;
      if (p.epoch !== undefined) f.epoch = p.epoch;
    }
    if (this._presenceOn()) f.presence = true;
    if (this._opts.echo === false) f.echo = false;
    if (this._opts.receipts || this._opts.onReceipts) f.receipts = true;
    this._sentSince = p ? p.seq : undefined;
    this._joining = true;
    this.client._send(f);
  }

  _onJoined(f) {
    this._joining = false;
    this._joined = true;
    const since = this._sentSince;
    const previousEpoch = this._epoch;
    if (f.recovered === false || (f.recovered === undefined && since !== undefined && typeof f.seq === "number" && since > f.seq && f.epoch === undefined)) {
      // The node cannot give every message after since (another history,
      // or retention took some): say so, then go on from where it starts.
      const from = typeof f.from === "number" ? f.from : f.seq + 1;
      const info = { room: this.name, since, from, seq: f.seq, epoch: f.epoch, previousEpoch };
      this._last = from - 1;
      this._epoch = f.epoch;
      this._save();
      if (this._opts.onReset) safeCall(this._opts.onReset, info);
      this.client._emit("reset", info);
    } else {
      if (since === undefined || this._last === undefined) this._last = since === undefined ? f.seq : since;
      if (f.epoch !== undefined) this._epoch = f.epoch;
      this._save();
    }
    if (this._opts.onJoined) safeCall(this._opts.onJoined, { room: this.name, seq: f.seq, epoch: f.epoch, recovered: f.recovered });
    if (this._markWant > this._markSent && !this._markTimer) this._sendMark(); // a mark made while away
    if (this._presenceOn() && this.client._transport === "websocket") this._askPresence();
  }

  // _presenceOn: presence asked for, and not refused on this connection.
  _presenceOn() {
    return !!this._opts.presence && !this._presenceOff;
  }

  // _askPresence takes a snapshot of who is here after each join: the diffs
  // the node sent while this client was away are lost with the connection,
  // and the app is given the difference from what it last knew instead.
  //
  // The node's answer may lag its diffs (it is a shared, periodic view):
  // a user a diff named while the answer was on its way keeps the diff's
  // verdict.
  _askPresence() {
    const n = ++this._snapshot;
    this._touched = new Set();
    this.presence().then(
      (p) => {
        if (n !== this._snapshot || this.client.rooms.get(this.name) !== this) return;
        const touched = this._touched;
        this._touched = null;
        const now = new Set(Array.isArray(p.users) ? p.users : []);
        // With more than the answer's 1000 names, absence proves nothing.
        const joined = [...now].filter((u) => !this._members.has(u) && !touched.has(u));
        const left = p.more ? [] : [...this._members].filter((u) => !now.has(u) && !touched.has(u));
        this._presenceChange(joined, left, true);
      },
      (err) => {
        if (n !== this._snapshot) return;
        this._touched = null;
        // Busy (too many requests waiting): ask again after a pause. A
        // node without presence (bad_request): only diffs, if any.
        const c = this.client;
        if (RETRYABLE.has(err.code) && c.rooms.get(this.name) === this) {
          c._setTimeout(() => {
            if (n === this._snapshot && c.rooms.get(this.name) === this && this._joined) this._askPresence();
          }, c._backoffDelayOnly());
        }
      },
    );
  }

  // _presenceChange applies a diff (or a snapshot's difference) to the
  // members and tells the app what actually changed: a diff the snapshot
  // already holds is not told twice.
  _presenceChange(joined, left, snapshot) {
    const j = [];
    const l = [];
    if (this._touched && !snapshot) {
      for (const u of joined) this._touched.add(u);
      for (const u of left) this._touched.add(u);
    }
    for (const u of joined) {
      if (typeof u === "string" && !this._members.has(u)) {
        this._members.add(u);
        j.push(u);
      }
    }
    for (const u of left) {
      if (typeof u === "string" && this._members.delete(u)) l.push(u);
    }
    if (!j.length && !l.length) return;
    const diff = { room: this.name, joined: j, left: l, snapshot };
    if (this._opts.onPresence) safeCall(this._opts.onPresence, diff);
    this.client._emit("presence", diff);
  }

  _onJoinErr(err) {
    this._joining = false;
    if (err.code === "forbidden" && this._presenceOn() && /presence/i.test(err.message)) {
      // The room has its node's most presence subscribers: the join is
      // refused whole. Messages matter more: join without presence, and
      // say so (the next connection tries presence again).
      this._presenceOff = true;
      const e = new RoostError("presence_limit", `Roost: room ${this.name} joined without presence: ${err.message}`, { ref: this.name });
      if (this._opts.onError) safeCall(this._opts.onError, e);
      this.client._emit("error", e);
      this._sendJoin();
      return;
    }
    if (RETRYABLE.has(err.code) || err.code === "internal") {
      // Not now: try the join again after a pause on this connection.
      const c = this.client;
      c._setTimeout(() => {
        if (c.rooms.get(this.name) === this && c._transport === "websocket" && !this._joined && !this._joining) this._sendJoin();
      }, c._backoffDelayOnly());
      return;
    }
    this._failed = err;
    if (this._opts.onError) safeCall(this._opts.onError, err);
    this.client._emit("error", err);
  }

  _onMsg(f) {
    if (typeof f.seq !== "number") return;
    if (this._last !== undefined && f.seq <= this._last) return; // a replay overlapping what we have
    if (this._last !== undefined && f.seq !== this._last + 1) {
      // A hole the node did not announce: never deliver past it. Reconnect,
      // which resumes from the last message delivered.
      const c = this.client;
      c._emit("error", new RoostError("gap", `Roost: room ${this.name} jumped from seq ${this._last} to ${f.seq}; resuming`));
      if (c._ws) c._drop(c._ws, CLOSE_ABNORMAL, "gap");
      else if (c._es) c._reopenSSE();
      return;
    }
    this._last = f.seq;
    this._save();
    const msg = { room: f.room, seq: f.seq, id: f.id, from: f.from, ts: f.ts, body: f.body };
    if (f.kind !== undefined) Object.assign(msg, { kind: f.kind, ref: f.ref });
    this._apply(msg);
    if (this._opts.onMessage) safeCall(this._opts.onMessage, msg);
    this.client._emit("message", msg);
  }

  // _apply folds a message into the view and the unread count, in order.
  _apply(m) {
    const kind = m.kind || "msg";
    if (kind === "msg") {
      this._view.set(m.seq, { seq: m.seq, id: m.id, from: m.from, ts: m.ts, body: m.body, edited: undefined, deleted: false, reactions: {} });
      this._trimView();
      const after = Math.max(this._read === undefined ? 0 : this._read, this._unreadBase ? this._unreadBase.upto : 0);
      if (m.from !== this.client.user && m.seq > after) {
        this._unreadSeqs.push(m.seq);
        this._unreadChanged();
      }
      return;
    }
    const v = this._view.get(m.ref);
    if (!v) return; // older than the view
    if (kind === "edit") Object.assign(v, { body: m.body, edited: m.ts });
    else if (kind === "delete") Object.assign(v, { body: null, deleted: true });
    else if (kind === "react") v.reactions[m.body] = (v.reactions[m.body] || 0) + 1;
    else if (kind === "unreact" && v.reactions[m.body] > 0) {
      if (--v.reactions[m.body] === 0) delete v.reactions[m.body];
    }
    if (this._opts.onChange) safeCall(this._opts.onChange, { ...v, reactions: { ...v.reactions } });
  }

  _trimView() {
    const max = this.client.options.viewLimit;
    if (this._view.size <= max) return;
    const seqs = [...this._view.keys()].sort((a, b) => a - b);
    for (const s of seqs.slice(0, seqs.length - max)) this._view.delete(s);
  }

  // _onRead moves the read position forward (a read answer, a mark of
  // this client, another tab's mark, an own publish) and the unread count
  // with it.
  _onRead(seq, local = false) {
    if (this._read !== undefined && seq <= this._read) {
      // Not news here, but it may be the node's answer to this client's
      // own mark, which the node's count now covers (_settleBase).
      if (!local) this._settleBase();
      return;
    }
    this._read = seq;
    this._unreadSeqs = this._unreadSeqs.filter((s) => s > seq);
    this._settleBase();
    if (!local) {
      const info = { room: this.name, seq };
      if (this._opts.onRead) safeCall(this._opts.onRead, info);
      this.client._emit("read", info);
    }
    this._unreadChanged();
  }

  _setUnread(u) {
    if (typeof u.read === "number" && (this._read === undefined || u.read > this._read)) this._read = u.read;
    if (typeof u.seq === "number" && typeof u.count === "number") {
      this._unreadBase = { upto: u.seq, count: u.count, from: typeof u.read === "number" ? u.read : 0 };
      this._unreadSeqs = this._unreadSeqs.filter((s) => s > u.seq);
      this._settleBase();
    }
    this._unreadChanged();
  }

  // _settleBase squares the node's count with this client's read position,
  // which may be newer than the one the node counted from: an own publish
  // acknowledged, or a mark sent, after the unread request left but before
  // its answer came (the node reads the store for the count after taking
  // the position). Read up to all it counted: nothing of it is unread. Read
  // past where it counted from, short of the end: how much of the count is
  // read is the node's to say, so it is asked again, once no mark of this
  // client's is waiting to be sent (a request made after the mark and
  // after an ack counts from them) and no answer is awaited already.
  _settleBase() {
    const b = this._unreadBase;
    if (!b || this._read === undefined) return;
    if (this._read >= b.upto) {
      this._unreadBase = null;
      return;
    }
    const c = this.client;
    if (this._read <= b.from || this._markWant > this._markSent || this._unreadAsking || c._transport !== "websocket") return;
    this._unreadAsking = true;
    c.unread([this.name])
      .catch(() => {})
      .finally(() => {
        this._unreadAsking = false;
      });
  }

  _unreadChanged() {
    const n = this.unread;
    if (n === this._unreadShown) return;
    this._unreadShown = n;
    const info = { room: this.name, count: n };
    if (this._opts.onUnread) safeCall(this._opts.onUnread, info);
    this.client._emit("unread", info);
  }
}

// safeCall runs an app callback; its exception is reported (to the
// console, as an uncaught error) without breaking the client's bookkeeping.
let reportError = (err) =>
  globalThis.reportError
    ? globalThis.reportError(err)
    : queueMicrotask(() => {
        throw err;
      });

function safeCall(fn, arg) {
  try {
    fn(arg);
  } catch (err) {
    reportError(err);
  }
}

/** Where exceptions thrown by app callbacks go (default: reportError, as uncaught). */
export function setErrorReporter(fn) {
  reportError = fn;
}

// entryPromise is the promise of an outbox entry, made on first demand: an
// entry restored after a reload has none until the app publishes its id
// again.
function entryPromise(e) {
  if (!e.promise) {
    e.promise = new Promise((resolve, reject) => {
      e.resolve = resolve;
      e.reject = reject;
    });
  }
  return e.promise;
}

function pickStorage(s) {
  if (s === null || s === false) return null;
  if (s) return s;
  try {
    const ss = globalThis.sessionStorage;
    if (ss) {
      const k = "roost:v1:probe";
      ss.setItem(k, "1");
      ss.removeItem(k);
      return ss;
    }
  } catch {
    // sandboxed or disabled
  }
  return memoryStorage();
}

/** A Storage-like object in memory (positions then last as long as the page). */
export function memoryStorage() {
  const m = new Map();
  return {
    getItem: (k) => (m.has(k) ? m.get(k) : null),
    setItem: (k, v) => void m.set(k, String(v)),
    removeItem: (k) => void m.delete(k),
  };
}

function httpURL(url) {
  return url.replace(/^ws(s?):/, "http$1:");
}

// tokenClaims reads a JWT's claims without checking it (the node does):
// exp schedules the refresh, app and sub scope the stored positions.
function tokenClaims(token) {
  try {
    const part = token.split(".")[1];
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((part.length + 3) % 4);
    const json = decodeURIComponent(
      Array.from(atob(b64), (ch) => "%" + ch.charCodeAt(0).toString(16).padStart(2, "0")).join(""),
    );
    const c = JSON.parse(json);
    return { exp: typeof c.exp === "number" ? c.exp : undefined, app: c.app, sub: c.sub };
  } catch {
    return {};
  }
}

function randomId(random) {
  const g = globalThis.crypto;
  if (g && g.getRandomValues) {
    const b = g.getRandomValues(new Uint8Array(8));
    return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  }
  let s = "";
  for (let i = 0; i < 16; i++) s += Math.floor(random() * 16).toString(16);
  return s;
}

function utf8Length(s) {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c < 0xdc00) {
      n += 4;
      i++;
    } else n += 3;
  }
  return n;
}
