-- Runtime charges: how far each sandbox's runtime has been charged.
ALTER TABLE sandboxes ADD COLUMN charged_until timestamptz;
UPDATE sandboxes SET charged_until = created_at;
ALTER TABLE sandboxes ALTER COLUMN charged_until SET DEFAULT now();
ALTER TABLE sandboxes ALTER COLUMN charged_until SET NOT NULL;
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_stop_reason_check;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_stop_reason_check
    CHECK (stop_reason IN ('destroyed', 'expired', 'failed', 'lost', 'insufficient_credits'));
CREATE INDEX sandboxes_uncharged ON sandboxes (charged_until) WHERE state = 'running';
