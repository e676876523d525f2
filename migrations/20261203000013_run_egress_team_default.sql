-- Runs get egress like sandboxes: a policy (NULL: loopback only) and vault credentials
-- (names) for their sandbox's proxy.
ALTER TABLE runs ADD COLUMN egress jsonb;
ALTER TABLE runs ADD COLUMN credentials text[] NOT NULL DEFAULT '{}';
-- A team's default egress policy: what a sandbox or run that says nothing about `egress`
-- gets (NULL: loopback only).
ALTER TABLE teams ADD COLUMN default_egress jsonb;
