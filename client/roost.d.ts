// Type declarations of roost.js, the browser client of a roost node.

export declare const VERSION: string;

/** An error of the node (err frame, close, HTTP refusal) or of the client. */
export declare class RoostError extends Error {
  /**
   * The node's err codes (bad_request, forbidden, not_found, too_large,
   * rate_limited, overloaded, internal) or the client's own: closed,
   * unauthorized, token_refused, token_callback, policy, outbox_full,
   * timeout, gap, unsupported, bad_url, storage (an outbox entry that
   * storage could not hold: it will not outlive a reload), presence_limit
   * (the room was joined without presence: its node's limit).
   */
  code: string;
  message: string;
  /** The command the node's err answered (a publish id or a room). */
  ref?: string;
  /** The HTTP status of a refused connection. */
  status?: number;
  constructor(code: string, message: string, extra?: object);
}

export type State = "connecting" | "open" | "reconnecting" | "closed";

/** A Storage-like place for positions (sessionStorage by default). */
export interface PositionStorage {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

export interface Message<Body = unknown> {
  room: string;
  /** Per room: 1, 2, 3, ... with no gap and no duplicate. */
  seq: number;
  /** The publisher's idempotency key. */
  id: string;
  /** The publishing user. */
  from: string;
  /** Commit time, Unix milliseconds. */
  ts: number;
  body: Body;
  /** edit, delete, react or unreact (absent on a plain message). */
  kind?: "edit" | "delete" | "react" | "unreact";
  /** The seq of the message an edit, delete or reaction is about. */
  ref?: number;
}

/** A message as it stands now: edits, deletes and reactions applied (Room.messages, folded history). */
export interface MessageView<Body = unknown> {
  seq: number;
  id: string;
  from: string;
  ts: number;
  /** The latest body; null once deleted. */
  body: Body | null;
  /** Time of the latest edit, Unix milliseconds. */
  edited?: number;
  deleted: boolean;
  /** Reaction → how many users gave it. */
  reactions: Record<string, number>;
}

/** A signal from another member: never stored, at most once. */
export interface Signal<Body = unknown> {
  room: string;
  from: string;
  body: Body;
}

/** The user's unread count of a room, as the node counts it. */
export interface UnreadInfo {
  /** The user's read position. */
  read: number;
  /** The room's newest seq. */
  seq: number;
  /** Messages after read, edits, deletes and reactions not counted. */
  count: number;
}

export interface ResetInfo {
  room: string;
  /** The position the client resumed from. */
  since: number | undefined;
  /** The first seq that follows; everything in (since, from) is lost to this client. */
  from: number;
  /** The room's newest seq at the join. */
  seq: number;
  epoch: string | undefined;
  previousEpoch: string | undefined;
}

/**
 * What changed in a room's members (Room.members), each change told once:
 * from the node's presence_diff frames, and after each join (the first,
 * and every reconnect) from a snapshot of who is here (snapshot: true), so
 * the changes made while the client was away are not lost.
 */
export interface PresenceDiff {
  room: string;
  joined: string[];
  left: string[];
  snapshot: boolean;
}

export interface RoomOptions<Body = unknown> {
  /** Every message, in seq order, each exactly once. */
  onMessage?(msg: Message<Body>): void;
  /** The node said recovered:false: messages were lost to this client; reload the view. */
  onReset?(info: ResetInfo): void;
  /** Subscribe to the room's presence: Room.members, kept up to date, and onPresence. */
  presence?: boolean;
  /** With presence: true, every change of Room.members. */
  onPresence?(diff: PresenceDiff): void;
  /**
   * A publish to this room was acknowledged: stored once, under seq. Called
   * for the publishes of this page and for those an earlier page of the tab
   * left unacknowledged (restored: true), which have no promise.
   */
  onAck?(ack: AckEvent<Body>): void;
  /** A publish to this room was refused for good (or discarded by close({discardOutbox: true})). */
  onNack?(nack: NackEvent<Body>): void;
  /** Each join's answer. */
  onJoined?(info: { room: string; seq: number; epoch?: string; recovered?: boolean }): void;
  /** The node refused the join (forbidden, bad_request, ...); the room is not retried. */
  onError?(err: RoostError): void;
  /** Where to start when no position is stored (0: every stored message). */
  since?: number;
  /** false: ignore (and do not use) a stored position for the first join. */
  resume?: boolean;
  /** false: this connection does not get the msg frames of its own publishes (their ack carries the seq). */
  echo?: boolean;
  /** Signals of the room's other members (typing, cursors). */
  onSignal?(signal: Signal): void;
  /** The user's read position moved (another tab or device, or the node's answer). */
  onRead?(info: { room: string; seq: number }): void;
  /** Room.unread changed. */
  onUnread?(info: { room: string; count: number }): void;
  /** Join with receipts: at most once a second, the read positions that moved. */
  receipts?: boolean;
  /** With receipts (implied by giving this): the users whose read position moved. */
  onReceipts?(info: { room: string; read: Record<string, number> }): void;
  /** A message of Room.messages changed (an edit, a delete, a reaction). */
  onChange?(message: MessageView<Body>): void;
}

export interface Ack {
  seq: number;
  id: string;
  room: string;
}

/** Every acknowledged publish (the "ack" event, a room's onAck). */
export interface AckEvent<Body = unknown> extends Ack {
  body: Body;
  /** Published by an earlier page of this tab and re-sent from the stored outbox. */
  restored: boolean;
}

/** Every publish refused for good (the "nack" event, a room's onNack). */
export interface NackEvent<Body = unknown> {
  id: string;
  room: string;
  body: Body;
  restored: boolean;
  error: RoostError;
}

export interface PublishOptions {
  /** The idempotency key (1 to 64 characters); default: unique per client. */
  id?: string;
  /** An edit, delete or reaction of message ref (Room.edit and the others set these). */
  kind?: "edit" | "delete" | "react" | "unreact";
  ref?: number;
}

export declare class Room<Body = unknown> {
  readonly client: Roost;
  readonly name: string;
  /** seq of the last message given to onMessage. */
  readonly seq: number | undefined;
  readonly epoch: string | undefined;
  readonly joined: boolean;
  /**
   * Resolves once the node has stored the message; rejects with a
   * RoostError. Publishing an id already in the outbox (one restored after
   * a reload included) gives that entry's promise, and sends nothing more.
   */
  publish(body: Body, opts?: PublishOptions): Promise<Ack>;
  /** Older messages; with fold: true only messages, each as it stands (they also enter Room.messages). */
  history(opts?: { before?: number; after?: number; limit?: number; fold?: false }): Promise<{ room: string; messages: Message<Body>[]; more?: boolean }>;
  history(opts: { before?: number; after?: number; limit?: number; fold: true }): Promise<{ room: string; messages: MessageView<Body>[]; more?: boolean }>;
  /** Replace message seq's body (the sender's own). */
  edit(seq: number, body: Body, opts?: PublishOptions): Promise<Ack>;
  /** Delete message seq (the sender's own). */
  delete(seq: number, opts?: PublishOptions): Promise<Ack>;
  /** React to message seq with a string of 1 to 32 bytes; a second same reaction stores nothing. */
  react(seq: number, reaction: string, opts?: PublishOptions): Promise<Ack>;
  unreact(seq: number, reaction: string, opts?: PublishOptions): Promise<Ack>;
  /** The room's messages as they stand, oldest first (at most viewLimit, the newest). */
  readonly messages: MessageView<Body>[];
  /** Send a signal to the room's other members; false when not sent (offline, or over the rate). Throws too_large over 1 KiB. */
  signal(body: unknown): boolean;
  /** Mark the room read up to seq; coalesced to one mark per readEvery ms. */
  markRead(seq: number): void;
  /** The user's read position, as last known. */
  readonly read: number | undefined;
  /** Unread messages: the node's count (client.unread) plus those seen since. */
  readonly unread: number;
  /** Every user's read position in the room (at most 1000, newest first, then more: true). */
  receipts(): Promise<{ room: string; read: Record<string, number>; more?: boolean }>;
  /** With presence: true, the users in the room as last known, sorted; undefined without. */
  readonly members: string[] | undefined;
  /** Who is here now, on every node (users: at most 1000, then more: true). */
  presence(): Promise<{ room: string; count: number; users: string[]; more?: boolean }>;
  leave(): void;
}

export interface OutboxEntry {
  id: string;
  room: string;
  body: unknown;
  /** Sent on the current connection and awaiting its ack. */
  sent: boolean;
  /** Left by an earlier page of this tab (restored from storage): no promise. */
  restored: boolean;
}

export interface CloseInfo {
  code: number;
  reason: string;
  /** The node's retry=MS hint, if it gave one. */
  retry: number | null;
  /** The connection had opened (false: it never got through). */
  wasOpen: boolean;
}

export interface RoostOptions {
  /** A JWT, or a function returning one (called again to refresh it before expiry). */
  token?: string | (() => string | Promise<string>);
  /** Insecure (development) nodes: the user and app to connect as. */
  user?: string;
  app?: string;
  /** Positions store; null for none. Default sessionStorage (memory when unavailable). */
  storage?: PositionStorage | null;
  /** Scope of the stored positions and outbox; default node URL + app + user. */
  storageKey?: string;
  /**
   * Keep unacknowledged publishes in storage too (default true), so that
   * the next page of the tab re-sends them under their ids.
   */
  persistOutbox?: boolean;
  /**
   * Allow the listen-only Server-Sent Events fallback (the node's /sse) when
   * WebSocket cannot be opened but the node answers over HTTP.
   */
  sse?: boolean;
  /** "auto" (default): WebSocket, and the SSE fallback if sse is true; "sse": listen-only, always over SSE. */
  transport?: "auto" | "sse";
  /** false: do not connect until connect() is called. */
  connect?: boolean;
  backoffMin?: number;
  backoffMax?: number;
  stableAfter?: number;
  connectTimeout?: number;
  pingInterval?: number;
  pongTimeout?: number;
  requestTimeout?: number;
  maxInFlight?: number;
  maxOutbox?: number;
  maxFrame?: number;
  refreshMargin?: number;
  sseAfter?: number;
  wsProbeInterval?: number;
  /** Signals a room may send per second (default 10, the node's default) and in a burst (20). */
  signalRate?: number;
  signalBurst?: number;
  /** ms between two read marks of a room (default 1000). */
  readEvery?: number;
  /** Messages a room's view keeps (default 1000). */
  viewLimit?: number;
  /**
   * The WebSocket class to connect with. Default: the environment's own
   * (browsers, Node 22+, Deno, Bun). Node 20 has none: pass the `ws`
   * package's (`import WebSocket from "ws"`).
   */
  WebSocket?: unknown;
  /** The EventSource class for the SSE fallback. Default: the environment's own. */
  EventSource?: unknown;
  /** The fetch function used to ask why a WebSocket did not open. Default: the environment's own. */
  fetch?: unknown;
  /** Test hooks: replace the clock and the randomness. */
  clock?: { setTimeout(fn: () => void, ms: number): unknown; clearTimeout(id: unknown): void; now(): number };
  random?: () => number;
}

export interface RoostEvents {
  state: State;
  open: { transport: "websocket" | "sse" };
  close: CloseInfo;
  /** A reconnect is scheduled in wait ms; why: "backoff" or "hint" (the node's retry=MS); attempt: the backoff's count of consecutive failures. */
  reconnect: { wait: number; attempt: number; why: "backoff" | "hint" };
  error: RoostError;
  reset: ResetInfo;
  outbox: OutboxEntry[];
  presence: PresenceDiff;
  ack: AckEvent;
  nack: NackEvent;
  message: Message;
  signal: Signal;
  read: { room: string; seq: number };
  unread: { room: string; count: number };
  receipts: { room: string; read: Record<string, number> };
}

export declare class Roost {
  constructor(url: string, options: RoostOptions);
  readonly url: string;
  readonly state: State;
  readonly transport: "websocket" | "sse" | null;
  readonly outbox: OutboxEntry[];
  readonly rooms: Map<string, Room>;
  /** The error that stopped the client, if one did. */
  readonly error: RoostError | null;
  room<Body = unknown>(name: string, opts?: RoomOptions<Body>): Room<Body>;
  /** This client's user (the user option, or the token's subject). */
  readonly user: string | undefined;
  /** The user's inbox, the room "@user": written by the app's backend only. */
  inbox<Body = unknown>(opts?: RoomOptions<Body>): Room<Body>;
  /** Unread counts of up to 100 rooms; the rooms open here take them as their count. */
  unread(rooms: string[]): Promise<Record<string, UnreadInfo>>;
  /** Publish to a room without joining it. */
  publish(room: string, body: unknown, opts?: PublishOptions): Promise<Ack>;
  on<E extends keyof RoostEvents>(event: E, fn: (arg: RoostEvents[E]) => void): () => void;
  off<E extends keyof RoostEvents>(event: E, fn: (arg: RoostEvents[E]) => void): void;
  connect(): void;
  /**
   * Close for good: pending promises reject with code "closed". The stored
   * outbox stays for the next page of the tab to re-send; discardOutbox:
   * true forgets it (each entry then a nack).
   */
  close(opts?: { discardOutbox?: boolean }): void;
}

/** A Storage-like object in memory. */
export declare function memoryStorage(): PositionStorage;

/** Where exceptions thrown by app callbacks go (default: reportError). */
export declare function setErrorReporter(fn: (err: unknown) => void): void;
