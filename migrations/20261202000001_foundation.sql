-- Accounts, teams, API keys and the audit log.

CREATE TABLE users (
    id            uuid PRIMARY KEY,
    email         text NOT NULL CHECK (length(email) BETWEEN 3 AND 254),
    password_hash text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
-- E-mail addresses are unique regardless of case.
CREATE UNIQUE INDEX users_email_key ON users (lower(email));

CREATE TABLE teams (
    id                 uuid PRIMARY KEY,
    name               text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    -- Per-team request rate limit; NULL means the configured default.
    rate_limit_per_sec integer CHECK (rate_limit_per_sec > 0),
    rate_limit_burst   integer CHECK (rate_limit_burst > 0),
    created_at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE team_members (
    team_id    uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    user_id    uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role       text NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, user_id)
);
CREATE INDEX team_members_user ON team_members (user_id);

CREATE TABLE api_keys (
    id           uuid PRIMARY KEY,
    team_id      uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    -- The public part of `sb_<public_id>_<secret>`.
    public_id    text NOT NULL UNIQUE,
    -- SHA-256 of the secret part; the secret itself is never stored.
    secret_hash  bytea NOT NULL CHECK (length(secret_hash) = 32),
    name         text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    role         text NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    created_by   uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    expires_at   timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX api_keys_team ON api_keys (team_id, created_at DESC);

CREATE TABLE audit_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    -- NULL when the caller could not be tied to a team (e.g. an unknown API key).
    team_id     uuid,
    actor_type  text NOT NULL CHECK (actor_type IN ('user', 'api_key', 'anonymous', 'system')),
    actor_id    text,
    action      text NOT NULL,
    target      text,
    source_ip   text,
    request_id  text,
    outcome     text NOT NULL CHECK (outcome IN ('success', 'failure', 'denied')),
    status_code integer,
    details     jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_events_team ON audit_events (team_id, id DESC);

-- The audit log is append-only: no row is ever changed or removed through SQL.
CREATE FUNCTION audit_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only';
END
$$;
CREATE TRIGGER audit_events_no_update_or_delete
    BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();
CREATE TRIGGER audit_events_no_truncate
    BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only();
