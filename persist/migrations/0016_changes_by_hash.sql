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
--
-- Building the index reads the whole table, and a migration holds its
-- locks until it commits: publishes to every room wait that long. An
-- operator with a large table builds it ahead without holding anyone up
-- (docs/operations.md, "Migrations that build an index"):
--   CREATE INDEX CONCURRENTLY messages_changes_0016 ON messages (room_id, ref, hashtextextended(sender, hashtextextended(reaction, 0)), seq) WHERE ref IS NOT NULL;
-- and this migration takes it in place of the old one. One that is not
-- valid (a concurrent build that failed) or not this definition is built
-- again here.
DO $$
BEGIN
	IF NOT EXISTS (
		SELECT 1 FROM pg_index i
		WHERE i.indexrelid = to_regclass('messages_changes_0016') AND i.indisvalid
			AND pg_get_indexdef(i.indexrelid) LIKE '%ON %messages USING btree (room_id, ref, hashtextextended(sender, hashtextextended(reaction, (0)::bigint)), seq) WHERE (ref IS NOT NULL)'
	) THEN
		DROP INDEX IF EXISTS messages_changes_0016;
		CREATE INDEX messages_changes_0016 ON messages (room_id, ref, hashtextextended(sender, hashtextextended(reaction, 0)), seq) WHERE ref IS NOT NULL;
	END IF;
END $$;
DROP INDEX messages_changes;
ALTER INDEX messages_changes_0016 RENAME TO messages_changes;
