-- A batch of changes committed from what a node knows (persist/changes.go,
-- runChangesKnown) must fail when a message it names was removed since
-- the node learned it. Removing entries does not move rooms.last_seq, so
-- the guard used to look each named message up in messages (a join, a
-- memo cache, two aggregates: ~2-3 µs of PostgreSQL CPU per reaction,
-- bench notes "react27"). kept_from says it on the room's row, which the
-- guard locks anyway: no message below it is known to be stored, every
-- message at or above it that was ever stored still is. 0: nothing was
-- removed. A constant default: the column is added without rewriting
-- rooms, and nodes start with nothing known, so rows removed before this
-- migration are never named from knowledge.
ALTER TABLE rooms ADD COLUMN kept_from bigint NOT NULL DEFAULT 0;

-- Retention raises kept_from itself, in a statement of its own before it
-- deletes (persist/retention.go), so that it never holds message rows
-- while waiting for a room's lock. This trigger covers every other
-- delete (connection events' trim, an older node's retention during an
-- upgrade, an operator's SQL): after a statement deleting entries, each
-- room's kept_from passes the newest message removed, or the message a
-- removed change named (a removed reaction is a standing reaction the
-- node may know). Where kept_from is past them already (retention's own
-- deletes) the UPDATE matches no row and locks nothing.
CREATE FUNCTION messages_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	UPDATE rooms r SET kept_from = g.upto + 1
	FROM (SELECT room_id, max(coalesce(ref, seq)) AS upto FROM removed GROUP BY room_id) g
	WHERE r.id = g.room_id AND r.kept_from <= g.upto;
	RETURN NULL;
END
$$;
CREATE TRIGGER messages_removed AFTER DELETE ON messages
	REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION messages_removed();
