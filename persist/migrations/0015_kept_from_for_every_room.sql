-- An unread count of a room that never had a change (rooms.listed_from
-- NULL: every entry a message, its count its seq) is its last_seq less
-- the larger of the read position and what retention removed, from the
-- room's row alone, no probe of messages (persist/reads.go, unreadSQL).
-- That needs kept_from to say what retention removed in every room: 0014
-- started it at 0, which is right only where nothing was removed before
-- it. Here each room whose oldest entry is past 1 gets that entry's seq,
-- and a room with entries counted but none stored gets last_seq + 1. One
-- probe of messages_pkey per room; rooms never trimmed keep 0.
UPDATE rooms r SET kept_from = o.first
FROM (SELECT x.id, coalesce(
		(SELECT m.seq FROM messages m WHERE m.room_id = x.id ORDER BY m.seq LIMIT 1),
		x.last_seq + 1) AS first
	FROM rooms x WHERE x.kept_from = 0 AND x.last_seq > 0) o
WHERE r.id = o.id AND o.first > 1;
