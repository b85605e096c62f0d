-- A room's epoch names its history: the seqs a client holds mean something
-- only in the epoch they came from. A room deleted and made again is a new
-- row, hence a new epoch, and a client resuming with the old one is told
-- that its messages are gone. Existing rooms get an epoch each (the default
-- is volatile, so every row gets its own value).
ALTER TABLE rooms ADD COLUMN epoch text NOT NULL
	DEFAULT substr(md5(random()::text || clock_timestamp()::text), 1, 16);
