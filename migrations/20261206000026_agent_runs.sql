-- Agent runs: the harness's conversations. One row each (what was asked, where it stands,
-- who holds its lease), its journal in two tables (`agent_run_steps`, the ledger, written
-- before each model or tool call; `agent_run_events`, the stream, numbered without gaps),
-- its conversation as the model sees it (`agent_run_items`) and the inputs waiting for the
-- next turn (`agent_run_inputs`).
CREATE TABLE agent_runs (
    id                uuid PRIMARY KEY,
    team_id           uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    -- Who made it: a key (its id), or a person (their user id), and the role they acted in.
    created_by_key    uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    created_by_user   uuid REFERENCES users (id) ON DELETE SET NULL,
    creator_role      text NOT NULL,
    -- The run's own key (a child of the creator's), its token sealed by the team's data key.
    run_key_id        uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    key_nonce         bytea NOT NULL,
    key_sealed        bytea NOT NULL,
    model             text NOT NULL,
    instructions      text,
    tools             jsonb NOT NULL DEFAULT '[]',
    -- What the sandbox is made with (POST /v1/sandboxes's body), or NULL for a given one.
    sandbox_spec      jsonb,
    sandbox_id        uuid,
    owns_sandbox      boolean NOT NULL,
    limits            jsonb NOT NULL DEFAULT '{}',
    parallel_tool_calls boolean NOT NULL DEFAULT true,
    on_uncertain_tool text NOT NULL DEFAULT 'fail',
    idle_timeout_secs integer NOT NULL,
    metadata          jsonb NOT NULL DEFAULT '{}',
    status            text NOT NULL CHECK (status IN ('queued', 'running', 'requires_action',
                          'idle', 'completed', 'failed', 'cancelled', 'limited')),
    -- Why it stopped, when it did ({code, message}).
    error             jsonb,
    required_actions  jsonb NOT NULL DEFAULT '[]',
    turns             integer NOT NULL DEFAULT 0,
    tool_calls        integer NOT NULL DEFAULT 0,
    usage             jsonb NOT NULL DEFAULT
        '{"input_tokens": 0, "cached_input_tokens": 0, "cache_write_tokens": 0, "output_tokens": 0}',
    cost_micro        bigint NOT NULL DEFAULT 0,
    last_seq          bigint NOT NULL DEFAULT 0,
    last_step         integer NOT NULL DEFAULT 0,
    -- A cancel asked for and not yet carried out: 'turn', 'run', 'idle' (the idle timeout:
    -- the run ends `completed`) or 'revoked' (its key was: `failed`).
    cancel_scope      text,
    -- The gateway stepping the run, until when, and the lease's epoch (raised by every
    -- claim: a write carrying an older epoch is refused).
    lease_owner       text,
    lease_until       timestamptz,
    lease_epoch       bigint NOT NULL DEFAULT 0,
    idempotency_key   text,
    request_hash      bytea,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz
);
CREATE INDEX agent_runs_team ON agent_runs (team_id, created_at DESC, id DESC);
-- The runs some gateway must step: claimed when their lease is missing or past.
CREATE INDEX agent_runs_active ON agent_runs (lease_until) WHERE status IN ('queued', 'running');
CREATE INDEX agent_runs_idle ON agent_runs (updated_at) WHERE status IN ('idle', 'requires_action');
CREATE UNIQUE INDEX agent_runs_idempotency ON agent_runs (team_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE agent_run_steps (
    run_id      uuid NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    seq         integer NOT NULL CHECK (seq > 0),
    turn        integer NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('model', 'tool')),
    step_state  text NOT NULL CHECK (step_state IN ('intended', 'completed', 'failed', 'interrupted')),
    -- A tool step: the call's id, the tool and its arguments; a model step: the model.
    call_id     text,
    name        text NOT NULL,
    args        jsonb NOT NULL DEFAULT '{}',
    -- What it gave: a model step its stop reason, usage and store request; a tool step its
    -- exit code or error and where its output is.
    result      jsonb,
    cost_micro  bigint NOT NULL DEFAULT 0,
    epoch       bigint NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE agent_run_events (
    run_id  uuid NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    seq     bigint NOT NULL CHECK (seq > 0),
    turn    integer NOT NULL,
    type    text NOT NULL,
    data    jsonb NOT NULL,
    at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

-- The conversation in the typed form of `sandbase-api` (one message a row).
CREATE TABLE agent_run_items (
    run_id  uuid NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    seq     integer NOT NULL CHECK (seq > 0),
    turn    integer NOT NULL,
    message jsonb NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- Inputs not yet taken by a turn (messages sent during one, tool results, decisions).
CREATE TABLE agent_run_inputs (
    id              uuid PRIMARY KEY,
    run_id          uuid NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    kind            text NOT NULL,
    body            jsonb NOT NULL,
    idempotency_key text,
    taken           boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX agent_run_inputs_pending ON agent_run_inputs (run_id, created_at) WHERE NOT taken;
CREATE UNIQUE INDEX agent_run_inputs_idempotency ON agent_run_inputs (run_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
