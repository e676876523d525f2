-- Stripe: a customer per team, the checkout sessions SandBase created, and every webhook
-- event received (deduplicated by its id).

CREATE TABLE stripe_customers (
    team_id     uuid PRIMARY KEY REFERENCES teams (id) ON DELETE CASCADE,
    customer_id text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE stripe_sessions (
    id             text PRIMARY KEY,
    team_id        uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    credits        bigint NOT NULL CHECK (credits > 0),
    amount_cents   bigint NOT NULL CHECK (amount_cents > 0),
    payment_intent text,
    granted        boolean NOT NULL DEFAULT false,
    refunded_cents bigint NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stripe_sessions_payment_intent ON stripe_sessions (payment_intent);

CREATE TABLE stripe_events (
    id          text PRIMARY KEY,
    type        text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    outcome     text NOT NULL
);
