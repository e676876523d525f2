-- How long a waiting agent run keeps the sandbox it made (paused) before it is released —
-- snapshotted first when the run keeps checkpoints — and the run's last snapshot, from which
-- its next sandbox starts.
ALTER TABLE agent_runs
    ADD COLUMN max_wait_secs integer NOT NULL DEFAULT 86400,
    ADD COLUMN checkpoints text NOT NULL DEFAULT 'none',
    ADD COLUMN checkpoint_snapshot uuid;
