-- Calls to the store's models and paid APIs: one row per call, written when it is settled
-- (with the ledger debit that charged it, in the same transaction). Token counts by kind,
-- never a prompt or a completion.
CREATE TABLE store_requests (
    id                   uuid PRIMARY KEY,
    team_id              uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    api_key_id           uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    sandbox_id           uuid REFERENCES sandboxes (id) ON DELETE SET NULL,
    kind                 text NOT NULL CHECK (kind IN ('model', 'api')),
    name                 text NOT NULL,
    endpoint             text NOT NULL,
    streamed             boolean NOT NULL,
    status               integer NOT NULL,
    input_tokens         bigint NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    cached_input_tokens  bigint NOT NULL DEFAULT 0 CHECK (cached_input_tokens >= 0),
    cache_write_tokens   bigint NOT NULL DEFAULT 0 CHECK (cache_write_tokens >= 0),
    output_tokens        bigint NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    cost_micro           bigint NOT NULL DEFAULT 0 CHECK (cost_micro >= 0),
    -- No usage ever arrived: the reservation was billed.
    estimated            boolean NOT NULL DEFAULT false,
    latency_ms           bigint NOT NULL,
    first_byte_ms        bigint,
    transaction_id       uuid REFERENCES ledger_transactions (id),
    created_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX store_requests_team ON store_requests (team_id, created_at DESC);
