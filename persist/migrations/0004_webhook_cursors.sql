-- What a webhook is owed is not written at commit: it is every message of
-- a room with seq > its cursor's delivered (no row: 0), and the messages
-- and rooms.last_seq are committed together, so a crash between commit and
-- delivery loses nothing. A cursor row is written once per POST, not per
-- message. owner and lease_until say which node delivers the room now: one
-- node per room keeps each room's events in seq order and lets several
-- nodes share an app's rooms. Setting a webhook (or widening its rooms)
-- sets the cursors of the app's existing rooms to their last_seq, so only
-- messages from then on are owed.
CREATE TABLE webhook_cursors (
	room_id     bigint PRIMARY KEY, -- rooms.id
	app         text NOT NULL,
	delivered   bigint NOT NULL DEFAULT 0,
	owner       text,
	lease_until timestamptz
) WITH (fillfactor = 50);

-- Events a receiver did not take within the app's max age. events is the
-- JSON array as it would have been POSTed; `roost webhook replay ID` sends
-- it again (replayed_at records when).
CREATE TABLE webhook_dead (
	id          bigserial PRIMARY KEY,
	app         text NOT NULL,
	room        text NOT NULL,
	from_seq    bigint NOT NULL,
	to_seq      bigint NOT NULL,
	failed_at   timestamptz NOT NULL DEFAULT now(),
	last_error  text NOT NULL,
	events      bytea NOT NULL,
	n_events    integer NOT NULL,
	replayed_at timestamptz
);
CREATE INDEX webhook_dead_app ON webhook_dead (app, id);
