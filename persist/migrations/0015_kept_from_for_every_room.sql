-- An unread count of a room that never had a change (rooms.listed_from
-- NULL: every entry a message, its count its seq) is its last_seq less
-- the larger of the read position and what retention removed, from the
-- room's row alone, no probe of messages (persist/reads.go, unreadSQL).
-- That needs kept_from to say what retention removed in every room: 0014
-- started it at 0, which is right only where nothing was removed before
-- it. Here each room whose oldest entry is past 1 gets that entry's seq,
-- and a room with entries counted but none stored gets last_seq + 1. One
-- probe of messages_pkey per room; rooms never trimmed keep 0.
UPDATE rooms r SET kept_from = coalesce(
	(SELECT m.seq FROM messages m WHERE m.room_id = r.id ORDER BY m.seq LIMIT 1),
	r.last_seq + 1)
WHERE r.kept_from = 0 AND r.last_seq > 0 AND coalesce(
	(SELECT m.seq FROM messages m WHERE m.room_id = r.id ORDER BY m.seq LIMIT 1),
	r.last_seq + 1) > 1;
