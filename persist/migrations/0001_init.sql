-- Apps are created on first use; the retention columns are set by the
-- operator (NULL: keep forever).
CREATE TABLE apps (
	id         text PRIMARY KEY,
	created_at timestamptz NOT NULL DEFAULT now(),
	max_age    interval,
	max_count  integer CHECK (max_count > 0)
);

-- last_seq is the room's newest committed seq: one UPDATE per room per
-- commit batch assigns a whole range of seqs. fillfactor leaves room on each
-- page so those updates stay HOT (no index maintenance per batch).
CREATE TABLE rooms (
	id       bigserial PRIMARY KEY,
	app      text NOT NULL REFERENCES apps (id),
	name     text NOT NULL,
	last_seq bigint NOT NULL DEFAULT 0,
	UNIQUE (app, name)
) WITH (fillfactor = 50);

-- The primary key serves since/history (range scans of one room by seq);
-- the unique key makes (room, sender, idempotency key) exactly-once.
-- batch is the commit batch's random token: it tells, after a connection
-- died during COMMIT, whether the batch's transaction committed.
CREATE TABLE messages (
	room_id  bigint NOT NULL, -- rooms.id; no foreign key: rooms are never deleted, and the per-row check would cost more PostgreSQL CPU than the insert
	seq      bigint NOT NULL,
	sender   text NOT NULL,
	idem_key bytea NOT NULL,
	ts       timestamptz NOT NULL,
	batch    bigint NOT NULL,
	body     bytea NOT NULL,
	PRIMARY KEY (room_id, seq),
	UNIQUE (room_id, sender, idem_key)
);
