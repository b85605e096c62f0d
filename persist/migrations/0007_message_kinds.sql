-- Messages that change (docs/protocol.md): an edit, delete, react or
-- unreact is an entry of the room's log like a message, with kind (0 msg,
-- 1 edit, 2 delete, 3 react, 4 unreact) and ref, the seq of the message
-- it changes. msgs is the room's count of messages (kind 0) up to and
-- including the entry, so an unread count is two index probes (rooms.msgs
-- less the entry at the read position), never a scan. Rows stored before
-- this migration are all messages: their msgs is NULL and means seq.
ALTER TABLE messages
	ADD COLUMN kind smallint NOT NULL DEFAULT 0,
	ADD COLUMN ref  bigint,
	ADD COLUMN msgs bigint;
ALTER TABLE rooms ADD COLUMN msgs bigint NOT NULL DEFAULT 0;
UPDATE rooms SET msgs = last_seq WHERE last_seq > 0;

-- A folded history lists messages only: newest first by this index, a
-- bounded number of rows per listed message whatever the reactions in
-- between. Retention finds a message's changes by the other.
CREATE INDEX messages_listed ON messages (room_id, seq) WHERE kind = 0;
CREATE INDEX messages_changes ON messages (room_id, ref) WHERE ref IS NOT NULL;

-- A message as it stands, for the messages that changed: the latest
-- edit's body and time, deleted, and the reactions held ({"👍":3}),
-- written by the commit that stores the change. fillfactor leaves room for
-- the updates of a hot message to stay HOT.
CREATE TABLE message_state (
	room_id   bigint NOT NULL, -- rooms.id
	seq       bigint NOT NULL, -- the message
	edited    timestamptz,
	body      bytea,
	deleted   boolean NOT NULL DEFAULT false,
	reactions jsonb NOT NULL DEFAULT '{}',
	PRIMARY KEY (room_id, seq)
) WITH (fillfactor = 50);

-- Both are written by the commit of a batch holding changes
-- (persist/changes.go), in its transaction, under its rooms' locks.
--
-- Each user's reaction to a message: the entry that stands (the react, or
-- the unreact that took it back), so a second react or an unreact of
-- nothing stores nothing and is answered with that entry's seq.
CREATE TABLE reactions (
	room_id  bigint NOT NULL,
	seq      bigint NOT NULL, -- the message
	sender   text NOT NULL,
	reaction text NOT NULL,
	entry    bigint NOT NULL,
	ts       timestamptz NOT NULL,
	active   boolean NOT NULL,
	PRIMARY KEY (room_id, seq, sender, reaction)
) WITH (fillfactor = 70);
