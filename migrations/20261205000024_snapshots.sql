-- Snapshots of sandboxes' state (/work and /tmp archives in the artifact store), kept until
-- they expire and metered as storage meanwhile.
CREATE TABLE snapshots (
    id          uuid PRIMARY KEY,
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    -- The sandbox it was taken of (its row stays after it stopped).
    sandbox_id  uuid NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    api_key_id  uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    user_id     uuid REFERENCES users (id) ON DELETE SET NULL,
    template    text NOT NULL,
    isolation   text NOT NULL CHECK (isolation IN ('runc', 'gvisor')),
    size_bytes  bigint NOT NULL CHECK (size_bytes >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX snapshots_team ON snapshots (team_id, created_at DESC, id DESC);
CREATE INDEX snapshots_expiry ON snapshots (expires_at);
