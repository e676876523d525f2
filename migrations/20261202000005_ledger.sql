-- Credits: an append-only double-entry ledger, grants with priority and expiry, and the
-- links from every debit to the grants it drew from. Amounts are integers, in
-- micro-credits (1 credit = 1 000 000).

CREATE TABLE ledger_transactions (
    id              uuid PRIMARY KEY,
    team_id         uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    kind            text NOT NULL CHECK (kind IN ('grant', 'debit', 'expiry', 'refund')),
    -- Makes a charge or grant idempotent: the same key is never booked twice.
    idempotency_key text NOT NULL UNIQUE,
    description     text NOT NULL,
    details         jsonb NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_transactions_team ON ledger_transactions (team_id, created_at DESC, id DESC);

CREATE TABLE grants (
    id             uuid PRIMARY KEY,
    team_id        uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    source         text NOT NULL CHECK (source IN ('starter', 'purchase', 'admin')),
    amount         bigint NOT NULL CHECK (amount > 0),
    -- Projection of the entries against this grant (`sandbase billing reconcile` checks it).
    remaining      bigint NOT NULL CHECK (remaining >= 0),
    -- Lower numbers are used first.
    priority       integer NOT NULL DEFAULT 10,
    effective_at   timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz,
    expired        boolean NOT NULL DEFAULT false,
    transaction_id uuid NOT NULL REFERENCES ledger_transactions (id),
    created_at     timestamptz NOT NULL DEFAULT now(),
    CHECK (remaining <= amount)
);
CREATE INDEX grants_team_open ON grants (team_id, priority, expires_at, created_at) WHERE remaining > 0 AND NOT expired;
CREATE INDEX grants_expiring ON grants (expires_at) WHERE remaining > 0 AND NOT expired;

-- Accounts are named: `team:<id>` (a team's credits), `system:issued` (where granted credits
-- come from), `system:purchases`, `system:usage` (where spent credits go), `system:breakage`
-- (expired credits). Every transaction's entries sum to zero.
CREATE TABLE ledger_entries (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    transaction_id uuid NOT NULL REFERENCES ledger_transactions (id),
    account        text NOT NULL,
    amount         bigint NOT NULL,
    -- The grant a team-account entry moves credits into or out of (NULL: overdraft).
    grant_id       uuid REFERENCES grants (id)
);
CREATE INDEX ledger_entries_transaction ON ledger_entries (transaction_id);
CREATE INDEX ledger_entries_account ON ledger_entries (account);
CREATE INDEX ledger_entries_grant ON ledger_entries (grant_id) WHERE grant_id IS NOT NULL;

-- The ledger is append-only.
CREATE FUNCTION ledger_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only';
END
$$;
CREATE TRIGGER ledger_entries_append_only BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_transactions_append_only BEFORE UPDATE OR DELETE ON ledger_transactions
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- Every transaction balances: checked when the inserting transaction commits.
CREATE FUNCTION ledger_transaction_balances() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    total numeric;
BEGIN
    SELECT coalesce(sum(amount), 0) INTO total FROM ledger_entries WHERE transaction_id = NEW.transaction_id;
    IF total <> 0 THEN
        RAISE EXCEPTION 'ledger transaction % does not balance (%)', NEW.transaction_id, total;
    END IF;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER ledger_entries_balance AFTER INSERT ON ledger_entries
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ledger_transaction_balances();
