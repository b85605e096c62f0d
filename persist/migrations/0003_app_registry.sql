-- The app registry. An app with a secret is registered (`roost app
-- create`); rows without one were made on first use by a publish (insecure
-- mode, --app-secret) and are not in the registry. Two secrets live side by
-- side during a rotation. limits holds the per-app overrides of the node
-- defaults as JSON (a missing key: the default; 0: off); settings is for
-- what later features attach to an app (webhooks, proxies).
ALTER TABLE apps
	ADD COLUMN secret          text,
	ADD COLUMN previous_secret text,
	ADD COLUMN previous_until  timestamptz,
	ADD COLUMN disabled        boolean NOT NULL DEFAULT false,
	ADD COLUMN limits          jsonb NOT NULL DEFAULT '{}',
	ADD COLUMN settings        jsonb NOT NULL DEFAULT '{}',
	ADD COLUMN updated_at      timestamptz NOT NULL DEFAULT now();

-- Every change of a row tells the listening nodes at once (they re-read
-- the registry; a periodic re-read covers a lost notification).
CREATE FUNCTION roost_apps_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('roost_apps', coalesce(NEW.id, OLD.id));
	RETURN NULL;
END
$$;

CREATE TRIGGER apps_changed AFTER INSERT OR UPDATE OR DELETE ON apps
	FOR EACH ROW EXECUTE FUNCTION roost_apps_changed();
