-- A team's own quota of sandboxes at once (creating or running); NULL: the deployment's
-- `sandboxes.max_per_team`.
ALTER TABLE teams ADD COLUMN max_sandboxes integer CHECK (max_sandboxes >= 1);
