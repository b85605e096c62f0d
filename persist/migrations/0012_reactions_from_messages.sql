-- A user's standing reaction to a message is answered from messages itself
-- (the latest react or unreact of that user, reaction and message), no
-- longer from a table of its own: a reaction was a messages row and index
-- entry plus a reactions row and index entry written by an upsert, and
-- cost 2.1-2.5 plain publishes of PostgreSQL CPU. reaction is the text of a
-- react or unreact (NULL for every other kind: no heap bytes), and
-- messages_changes, the index retention finds a message's changes by,
-- carries it with the sender and seq, so the lookup is one descent of an
-- index every change writes anyway. The reactions table held nothing the
-- log does not: dropping it loses nothing.
ALTER TABLE messages ADD COLUMN reaction text;
-- The entries stored before: the reaction is their body's JSON string.
UPDATE messages SET reaction = convert_from(body, 'UTF8')::jsonb #>> '{}' WHERE ref IS NOT NULL AND kind IN (3, 4);
DROP TABLE reactions;
DROP INDEX messages_changes;
CREATE INDEX messages_changes ON messages (room_id, ref, sender, reaction, seq) WHERE ref IS NOT NULL;
