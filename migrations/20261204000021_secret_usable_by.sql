-- Who may attach a secret to a sandbox or run: admins (and owners) unless the secret says
-- every member may.
ALTER TABLE secrets
    ADD COLUMN usable_by text NOT NULL DEFAULT 'admin' CHECK (usable_by IN ('admin', 'member'));
