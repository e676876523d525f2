-- Workers, and the sandboxes they host for teams.

CREATE TABLE workers (
    id            text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 200),
    url           text NOT NULL,
    capacity      integer NOT NULL CHECK (capacity >= 0),
    registered_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sandboxes (
    id          uuid PRIMARY KEY,
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    -- Who created it: an API key, or a user's session.
    api_key_id  uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    user_id     uuid REFERENCES users (id) ON DELETE SET NULL,
    template    text NOT NULL,
    state       text NOT NULL CHECK (state IN ('creating', 'running', 'stopped')),
    stop_reason text CHECK (stop_reason IN ('destroyed', 'expired', 'failed', 'lost')),
    worker_id   text REFERENCES workers (id),
    cwd         text NOT NULL,
    cpu_millis  integer NOT NULL,
    memory_mb   integer NOT NULL,
    disk_mb     integer NOT NULL,
    pids        integer NOT NULL,
    metadata    jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    stopped_at  timestamptz,
    CHECK ((state = 'stopped') = (stop_reason IS NOT NULL))
);
CREATE INDEX sandboxes_team ON sandboxes (team_id, created_at DESC);
CREATE INDEX sandboxes_live_expiry ON sandboxes (expires_at) WHERE state <> 'stopped';
CREATE INDEX sandboxes_live_worker ON sandboxes (worker_id) WHERE state <> 'stopped';
CREATE INDEX sandboxes_metadata ON sandboxes USING gin (metadata jsonb_path_ops);
