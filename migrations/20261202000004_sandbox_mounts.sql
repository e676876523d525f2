-- The volumes a sandbox mounted.
ALTER TABLE sandboxes ADD COLUMN mounts jsonb NOT NULL DEFAULT '[]';
