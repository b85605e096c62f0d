-- The server API lists an app's rooms by name in byte order
-- (GET /v1/apps/{app}/rooms?prefix=P&after=NAME&limit=L). The UNIQUE
-- (app, name) index sorts names by the database's collation, which in most
-- locales is not byte order and cannot serve a prefix range; this one
-- serves every page as one range scan, whatever the collation. A room row
-- is inserted once and then only its last_seq changes, which no index
-- holds: commits stay HOT updates and never touch this index.
CREATE INDEX rooms_app_name_bytes ON rooms (app, name COLLATE "C");
