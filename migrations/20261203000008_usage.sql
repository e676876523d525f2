-- Usage from the workers and the rest of the platform, charged to the ledger.
--
-- Samples are a running sandbox's cumulative counters (wall time since it became the team's,
-- CPU time of its cgroup), numbered per sandbox: a resend conflicts and changes nothing, an
-- older sample carries smaller counters and adds nothing. Events are discrete quantities
-- (model tokens, API calls, egress bytes) with a unique key. Both are written before they
-- are acknowledged and charged later, in batches, each row naming the ledger transaction
-- that charged it.

CREATE TABLE usage_samples (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sandbox_id     uuid NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    team_id        uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    seq            bigint NOT NULL CHECK (seq > 0),
    uptime_ms      bigint NOT NULL CHECK (uptime_ms >= 0),
    cpu_usec       bigint NOT NULL CHECK (cpu_usec >= 0),
    final          boolean NOT NULL DEFAULT false,
    sampled_at     timestamptz NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    -- Folded into its sandbox's highest counters (`sandboxes.sampled_*`).
    processed      boolean NOT NULL DEFAULT false,
    UNIQUE (sandbox_id, seq)
);
CREATE INDEX usage_samples_pending ON usage_samples (id) WHERE NOT processed;

CREATE TABLE usage_events (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_key      text NOT NULL UNIQUE CHECK (length(event_key) BETWEEN 1 AND 500),
    team_id        uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    sandbox_id     uuid REFERENCES sandboxes (id) ON DELETE SET NULL,
    api_key_id     uuid REFERENCES api_keys (id) ON DELETE SET NULL,
    kind           text NOT NULL,
    subject        text NOT NULL DEFAULT '',
    quantity       bigint NOT NULL CHECK (quantity >= 0),
    occurred_at    timestamptz NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    processed      boolean NOT NULL DEFAULT false,
    transaction_id uuid REFERENCES ledger_transactions (id)
);
CREATE INDEX usage_events_pending ON usage_events (id) WHERE NOT processed;

-- Each sandbox's highest counters reported (`sampled_*`: the last sample, at destroy, sets
-- `sampled_final`), how far they have been charged (`metered_*`), what it cost so far, and
-- its own spend cap.
ALTER TABLE sandboxes
    ADD COLUMN sampled_seq bigint NOT NULL DEFAULT 0,
    ADD COLUMN sampled_ms bigint NOT NULL DEFAULT 0,
    ADD COLUMN sampled_cpu_usec bigint NOT NULL DEFAULT 0,
    ADD COLUMN sampled_final boolean NOT NULL DEFAULT false,
    ADD COLUMN metered_seq bigint NOT NULL DEFAULT 0,
    ADD COLUMN metered_ms bigint NOT NULL DEFAULT 0,
    ADD COLUMN metered_cpu_usec bigint NOT NULL DEFAULT 0,
    ADD COLUMN metered_final boolean NOT NULL DEFAULT false,
    ADD COLUMN spent_micro bigint NOT NULL DEFAULT 0,
    ADD COLUMN max_credits bigint CHECK (max_credits > 0);
-- Sandboxes with reported usage not charged yet.
CREATE INDEX sandboxes_uncharged_usage ON sandboxes (id)
    WHERE sampled_ms <> metered_ms OR sampled_cpu_usec <> metered_cpu_usec OR sampled_final <> metered_final;
-- Runtime is charged from the workers' samples now, not from the gateway's clock.
DROP INDEX sandboxes_uncharged;
ALTER TABLE sandboxes DROP COLUMN charged_until;
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_stop_reason_check;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_stop_reason_check
    CHECK (stop_reason IN ('destroyed', 'expired', 'failed', 'lost', 'insufficient_credits', 'spend_cap'));

-- A key's spend cap, and what the sandboxes and calls it made have cost so far.
ALTER TABLE api_keys
    ADD COLUMN max_credits bigint CHECK (max_credits > 0),
    ADD COLUMN spent_micro bigint NOT NULL DEFAULT 0;
