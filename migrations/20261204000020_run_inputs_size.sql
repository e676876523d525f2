-- The size of a queued run's inputs in the store, so they are metered as storage like
-- artifacts; a run that waits in the queue past the artifact retention fails and its inputs go.
ALTER TABLE runs ADD COLUMN inputs_size bigint;
