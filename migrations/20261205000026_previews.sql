-- Preview URLs: the ports of a sandbox opened at {port}-{sandbox}.{preview domain}, each with
-- a token (only its hash is kept) unless public.
CREATE TABLE previews (
    sandbox_id  uuid NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    port        integer NOT NULL CHECK (port BETWEEN 1 AND 65535),
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    public      boolean NOT NULL,
    token_hash  bytea NOT NULL,
    api_key_id  uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    user_id     uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sandbox_id, port)
);
CREATE INDEX previews_team ON previews (team_id);
