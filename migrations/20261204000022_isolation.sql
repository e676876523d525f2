-- The isolation level of a sandbox (and of a run's sandbox): runc, or gVisor.
ALTER TABLE sandboxes
    ADD COLUMN isolation text NOT NULL DEFAULT 'runc' CHECK (isolation IN ('runc', 'gvisor'));
ALTER TABLE runs
    ADD COLUMN isolation text NOT NULL DEFAULT 'runc' CHECK (isolation IN ('runc', 'gvisor'));
