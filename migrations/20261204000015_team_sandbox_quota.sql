-- A team's own quota of sandboxes at once (creating or running); NULL: the deployment's
-- `sandboxes.max_per_team`.
ALTER TABLE teams ADD COLUMN max_sandboxes integer CHECK (max_sandboxes >= 1);
-- The quota is counted on every create: over a team's live sandboxes only, never its history.
CREATE INDEX sandboxes_team_live ON sandboxes (team_id) WHERE state <> 'stopped';
