-- E-mail verification: when the gateway requires it, a new account holds no credits and no
-- API key until its owner proves the address with the token mailed to it. Accounts made
-- before (or without verification) count as verified.
ALTER TABLE users ADD COLUMN email_verified_at timestamptz;
UPDATE users SET email_verified_at = created_at;

CREATE TABLE email_verifications (
    -- SHA-256 of the token; the token itself is only in the mail.
    token_hash bytea PRIMARY KEY,
    user_id uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    team_id uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at timestamptz
);
CREATE INDEX email_verifications_user ON email_verifications (user_id);
