-- Refunds and disputes Stripe reports before the checkout session they reverse has completed
-- (its payment intent not yet known here): kept, and applied when the session completes.
CREATE TABLE stripe_held_events (
    event_id text PRIMARY KEY,
    payment_intent text NOT NULL,
    event jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stripe_held_events_payment ON stripe_held_events (payment_intent);
