-- Recordings of terminal sessions (asciicast v2, written by the worker in chunks into the
-- artifact store as the session goes), one row each, kept for the recording retention.
CREATE TABLE recordings (
    id          uuid PRIMARY KEY,
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    sandbox_id  uuid NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    -- The terminal session's number in its sandbox, once it is open.
    session     integer,
    api_key_id  uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    user_id     uuid REFERENCES users (id) ON DELETE SET NULL,
    command     jsonb NOT NULL DEFAULT '[]',
    with_input  boolean NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz,
    duration_ms bigint,
    bytes       bigint NOT NULL DEFAULT 0 CHECK (bytes >= 0),
    chunks      integer NOT NULL DEFAULT 0 CHECK (chunks >= 0),
    exit_code   integer,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX recordings_team ON recordings (team_id, started_at DESC, id DESC);
CREATE INDEX recordings_sandbox ON recordings (sandbox_id, session);
CREATE INDEX recordings_expiry ON recordings (expires_at);
