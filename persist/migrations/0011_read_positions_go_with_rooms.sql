-- A room's read positions go with the room: deleting a room (an operator,
-- or a later feature) deletes its users' positions in the same
-- transaction, so a room made again under the same name starts with none
-- and no position outlives its room. A trigger rather than a foreign key:
-- the key's check would cost every position write a lookup of rooms,
-- where the trigger costs nothing until a room is deleted.
CREATE FUNCTION read_positions_go_with_room() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	DELETE FROM read_positions WHERE room_id = OLD.id;
	RETURN OLD;
END;
$$;

CREATE TRIGGER read_positions_go_with_room AFTER DELETE ON rooms
	FOR EACH ROW EXECUTE FUNCTION read_positions_go_with_room();

-- Positions of rooms deleted before this migration.
DELETE FROM read_positions rp WHERE NOT EXISTS (SELECT 1 FROM rooms r WHERE r.id = rp.room_id);

-- A position is rewritten about once a second while its user reads: room
-- on each page for the new row version keeps the update HOT (no index
-- entry of its own), most of a write's cost otherwise.
ALTER TABLE read_positions SET (fillfactor = 70);
