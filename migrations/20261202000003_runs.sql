-- Runs: one-shot "files in, command, files out" jobs, queued fairly between teams.

CREATE TABLE runs (
    id            uuid PRIMARY KEY,
    team_id       uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    api_key_id    uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    user_id       uuid REFERENCES users (id) ON DELETE SET NULL,
    template      text NOT NULL,
    argv          jsonb NOT NULL,
    env           jsonb NOT NULL DEFAULT '{}',
    outputs       text NOT NULL,
    timeout_secs  integer NOT NULL CHECK (timeout_secs > 0),
    cpu_millis    integer NOT NULL,
    memory_mb     integer NOT NULL,
    disk_mb       integer NOT NULL,
    pids          integer NOT NULL,
    has_inputs    boolean NOT NULL DEFAULT false,
    state         text NOT NULL CHECK (state IN ('queued', 'running', 'completed', 'failed')),
    sandbox_id    uuid REFERENCES sandboxes (id) ON DELETE SET NULL,
    exit_code     integer,
    timed_out     boolean NOT NULL DEFAULT false,
    stdout        text,
    stderr        text,
    error         text,
    artifact_size bigint,
    -- The gateway executing a running run renews this; past it, the run failed.
    lease_until   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    finished_at   timestamptz
);
CREATE INDEX runs_team ON runs (team_id, created_at DESC);
CREATE INDEX runs_queued ON runs (created_at) WHERE state = 'queued';
CREATE INDEX runs_running ON runs (lease_until) WHERE state = 'running';
