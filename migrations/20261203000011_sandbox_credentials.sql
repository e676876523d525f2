-- Vault credentials (names only) a sandbox's egress proxy injects into its requests.
ALTER TABLE sandboxes ADD COLUMN credentials text[] NOT NULL DEFAULT '{}';
