-- Run artifacts are kept for `runs.artifact_retention_secs` after their run finished, then
-- deleted from the store (the run row stays, saying when); while kept, they count as storage.
ALTER TABLE runs ADD COLUMN artifact_deleted_at timestamptz;
CREATE INDEX runs_live_artifacts ON runs (finished_at)
    WHERE artifact_size IS NOT NULL AND artifact_deleted_at IS NULL;
