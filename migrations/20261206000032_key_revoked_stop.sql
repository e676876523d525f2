-- A sandbox made with an API key stops when that key is revoked or expires (unless the
-- operator keeps such sandboxes: `sandboxes.stop_with_key = false`).
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_stop_reason_check;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_stop_reason_check
    CHECK (stop_reason IN ('destroyed', 'expired', 'failed', 'lost', 'insufficient_credits',
                           'spend_cap', 'key_revoked'));
