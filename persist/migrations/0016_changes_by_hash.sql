-- messages_changes keys a change by a hash of its sender and reaction in
-- place of the two texts: (room_id, ref, hash, seq), every column fixed
-- width. A reaction's entry goes to a random place among the entries of
-- the few messages a hot room's reactions name, and its descent compares
-- it with entries tied on (room_id, ref): with the texts in the key each
-- such compare was a text compare under the database's libc collation
-- (bttextcmp, strcoll) and reached seq past two variable-width columns
-- (nocache_index_getattr). The entry cost ~3.9 µs of PostgreSQL CPU to
-- insert and costs ~2.4 with the hash, and the index is 15 % smaller;
-- the texts compared bytewise (COLLATE "C") saved ~0.1 µs (bench notes,
-- idx27). The index serves the same two lookups: a user's standing
-- reaction, by the hash and the latest seq, the texts checked on the row
-- (another sender and reaction share the hash only by a 64-bit
-- collision), and retention's changes of a message, by room_id and ref.
-- Edits and deletes, whose reaction is NULL, have a NULL hash.
DROP INDEX messages_changes;
CREATE INDEX messages_changes ON messages (room_id, ref, hashtextextended(sender, hashtextextended(reaction, 0)), seq) WHERE ref IS NOT NULL;
