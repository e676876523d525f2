-- Paused sandboxes: frozen on their worker, memory kept, charged for memory only while
-- paused (usage samples say how much of their wall time was paused).
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_state_check;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_state_check
    CHECK (state IN ('creating', 'running', 'paused', 'stopped'));
ALTER TABLE sandboxes
    ADD COLUMN auto_pause_secs integer CHECK (auto_pause_secs BETWEEN 1 AND 86400),
    ADD COLUMN sampled_paused_ms bigint NOT NULL DEFAULT 0,
    ADD COLUMN metered_paused_ms bigint NOT NULL DEFAULT 0;
ALTER TABLE usage_samples
    ADD COLUMN paused_ms bigint NOT NULL DEFAULT 0 CHECK (paused_ms >= 0);
