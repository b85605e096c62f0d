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

-- roost_commit_changes commits a batch holding changes, in one call: the
-- rules need each row checked against the log as the rows before it left
-- it (an edit of a message of the same batch, a react then an unreact).
-- It locks the batch's rooms in id order (the one order of every commit
-- of every node, as the set-based statements do), numbers the new entries
-- per room, and answers each distinct input row: status 0 stored (seq,
-- ts), 1 nothing stored, answered with seq and ts (the key was stored
-- before; a reaction that stands, an unreact of nothing), 2 ref not a
-- message of the room or a deleted one, 3 not the sender's message.
-- Plain batches never come here (see persist/postgres.go, commitSQL).
CREATE FUNCTION roost_commit_changes(
	p_room int8[], p_sender text[], p_key bytea[], p_body bytea[],
	p_kind int2[], p_ref int8[], p_text text[], p_any bool[], p_batch int8)
RETURNS TABLE (ord int4, status int2, seq int8, ts timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
	n int := coalesce(array_length(p_room, 1), 0);
	now_ts timestamptz := now();
	rids int8[];
	lasts int8[];
	counts int8[];
	j int;
	k int2;
	s int8;
	r_kind int2;
	r_sender text;
	r_ts timestamptz;
	r_deleted bool;
	x_entry int8;
	x_ts timestamptz;
	x_active bool;
	-- Reaction counts change once per message and batch, at the end: a hot
	-- message's state row updated once, not once per reaction.
	d_room int8[] := '{}';
	d_seq int8[] := '{}';
	d_text text[] := '{}';
	d_delta int4[] := '{}';
BEGIN
	SELECT array_agg(l.id ORDER BY l.id), array_agg(l.last_seq ORDER BY l.id), array_agg(l.msgs ORDER BY l.id)
		INTO rids, lasts, counts
		FROM (SELECT r.id, r.last_seq, r.msgs FROM rooms r WHERE r.id = ANY (p_room) ORDER BY r.id FOR NO KEY UPDATE) l;
	FOR i IN 1 .. n LOOP
		ord := i - 1;
		SELECT m.seq, m.ts INTO s, r_ts FROM messages m
			WHERE m.room_id = p_room[i] AND m.sender = p_sender[i] AND m.idem_key = p_key[i];
		IF FOUND THEN
			status := 1; seq := s; ts := r_ts;
			RETURN NEXT;
			CONTINUE;
		END IF;
		k := p_kind[i];
		IF k <> 0 THEN
			SELECT m.kind, m.sender, m.ts, coalesce(st.deleted, false) INTO r_kind, r_sender, r_ts, r_deleted
				FROM messages m LEFT JOIN message_state st ON st.room_id = m.room_id AND st.seq = m.seq
				WHERE m.room_id = p_room[i] AND m.seq = p_ref[i];
			IF NOT FOUND OR r_kind <> 0 OR r_deleted THEN
				status := 2; seq := 0; ts := now_ts;
				RETURN NEXT;
				CONTINUE;
			END IF;
			IF k IN (1, 2) AND NOT p_any[i] AND r_sender <> p_sender[i] THEN
				status := 3; seq := 0; ts := now_ts;
				RETURN NEXT;
				CONTINUE;
			END IF;
			IF k IN (3, 4) THEN
				SELECT x.entry, x.ts, x.active INTO x_entry, x_ts, x_active FROM reactions x
					WHERE x.room_id = p_room[i] AND x.seq = p_ref[i] AND x.sender = p_sender[i] AND x.reaction = p_text[i];
				IF NOT FOUND THEN
					x_entry := p_ref[i]; x_ts := r_ts; x_active := false;
				END IF;
				IF x_active = (k = 3) THEN
					status := 1; seq := x_entry; ts := x_ts;
					RETURN NEXT;
					CONTINUE;
				END IF;
			END IF;
		END IF;
		j := array_position(rids, p_room[i]);
		lasts[j] := lasts[j] + 1;
		IF k = 0 THEN
			counts[j] := counts[j] + 1;
		END IF;
		s := lasts[j];
		INSERT INTO messages (room_id, seq, sender, idem_key, ts, body, batch, kind, ref, msgs)
			VALUES (p_room[i], s, p_sender[i], p_key[i], now_ts, coalesce(p_body[i], ''::bytea), p_batch, k,
				CASE WHEN k = 0 THEN NULL ELSE p_ref[i] END, counts[j]);
		IF k = 1 THEN
			INSERT INTO message_state AS st (room_id, seq, edited, body) VALUES (p_room[i], p_ref[i], now_ts, p_body[i])
				ON CONFLICT (room_id, seq) DO UPDATE SET edited = EXCLUDED.edited, body = EXCLUDED.body;
		ELSIF k = 2 THEN
			INSERT INTO message_state AS st (room_id, seq, deleted) VALUES (p_room[i], p_ref[i], true)
				ON CONFLICT (room_id, seq) DO UPDATE SET deleted = true, body = NULL;
		ELSIF k IN (3, 4) THEN
			INSERT INTO reactions AS x (room_id, seq, sender, reaction, entry, ts, active)
				VALUES (p_room[i], p_ref[i], p_sender[i], p_text[i], s, now_ts, k = 3)
				ON CONFLICT (room_id, seq, sender, reaction) DO UPDATE SET entry = EXCLUDED.entry, ts = EXCLUDED.ts, active = EXCLUDED.active;
			d_room := d_room || p_room[i];
			d_seq := d_seq || p_ref[i];
			d_text := d_text || p_text[i];
			d_delta := d_delta || CASE WHEN k = 3 THEN 1 ELSE -1 END;
		END IF;
		status := 0; seq := s; ts := now_ts;
		RETURN NEXT;
	END LOOP;
	IF cardinality(d_room) > 0 THEN
		-- The rooms are locked: no other commit writes their state rows.
		INSERT INTO message_state AS st (room_id, seq, reactions)
		SELECT a.room_id, a.seq, '{}' FROM (SELECT DISTINCT room_id, seq FROM unnest(d_room, d_seq) AS u (room_id, seq)) a
		ON CONFLICT (room_id, seq) DO NOTHING;
		UPDATE message_state st SET reactions = n.reactions
		FROM (
			SELECT c.room_id, c.seq, coalesce(jsonb_object_agg(c.t, c.n) FILTER (WHERE c.n > 0), '{}') AS reactions
			FROM (
				SELECT x.room_id, x.seq, x.t, sum(x.n) AS n FROM (
					SELECT s.room_id, s.seq, e.key AS t, e.value::int AS n
					FROM message_state s, jsonb_each_text(s.reactions) e
					WHERE (s.room_id, s.seq) IN (SELECT * FROM unnest(d_room, d_seq))
					UNION ALL
					SELECT * FROM unnest(d_room, d_seq, d_text, d_delta)
				) x GROUP BY 1, 2, 3
			) c GROUP BY 1, 2
		) n
		WHERE st.room_id = n.room_id AND st.seq = n.seq;
	END IF;
	UPDATE rooms r SET last_seq = u.l, msgs = u.c
		FROM unnest(rids, lasts, counts) AS u (id, l, c)
		WHERE r.id = u.id AND r.last_seq <> u.l;
END
$$;
