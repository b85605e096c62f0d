-- A room of 1,000,000 entries for `roost bench kinds --mode fold`: after
-- the room's existing entries, a message, then three reactions to it, in
-- turn; every message with a state row (two reactions kinds), one in two
-- edited. Run with the node stopped (it caches the room's seq), then start
-- it again: psql -v room=ID -v entries=1000000 -f this file.
BEGIN;
CREATE TEMP TABLE fill AS SELECT last_seq AS base FROM rooms WHERE id = :room;
INSERT INTO messages (room_id, seq, sender, idem_key, ts, body, batch, kind, ref, msgs, reaction)
SELECT :room, f.base + g, 'u' || (g % 97), convert_to('fill' || g, 'UTF8'), now(), convert_to('{"text":"message ' || g || '"}', 'UTF8'), 0,
	CASE WHEN g % 4 = 1 THEN 0 ELSE 3 END, CASE WHEN g % 4 = 1 THEN NULL ELSE f.base + g - (g - 1) % 4 END, (g + 3) / 4,
	CASE WHEN g % 4 = 1 THEN NULL ELSE (ARRAY['👍','🎉','❤'])[g % 4] END
FROM fill f, generate_series(1, :entries - (SELECT base FROM fill)) g;
INSERT INTO message_state (room_id, seq, edited, body, reactions)
SELECT :room, f.base + g, CASE WHEN g % 8 = 1 THEN now() END, CASE WHEN g % 8 = 1 THEN convert_to('"edited"', 'UTF8') END, '{"👍": 1, "🎉": 1, "❤": 1}'
FROM fill f, generate_series(1, :entries - (SELECT base FROM fill), 4) g;
UPDATE rooms SET last_seq = :entries, msgs = msgs + (SELECT count(*) FROM messages WHERE room_id = :room AND seq > (SELECT base FROM fill) AND kind = 0),
	listed_from = coalesce(listed_from, (SELECT base FROM fill) + 2) WHERE id = :room;
COMMIT;
ANALYZE messages;
ANALYZE message_state;
