-- What a worker may claim in its heartbeats is bounded by what it claimed when it registered
-- (its capacity) and by its first heartbeat after (its memory and CPU): a stolen worker
-- credential cannot attract sandboxes by over-reporting them later.
ALTER TABLE workers ADD COLUMN memory_mb bigint CHECK (memory_mb >= 0);
ALTER TABLE workers ADD COLUMN cpu_millis bigint CHECK (cpu_millis >= 0);
