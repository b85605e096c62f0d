-- A user's read position in a room: the newest seq the user has read
-- there. Positions only move forward (GREATEST on write); nodes write them
-- coalesced, the latest per user and room at most once a second, many in
-- one statement.
CREATE TABLE read_positions (
	room_id bigint NOT NULL, -- rooms.id
	user_id text NOT NULL,
	seq     bigint NOT NULL,
	PRIMARY KEY (room_id, user_id)
);
