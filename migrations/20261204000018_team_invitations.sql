-- Adding a member by e-mail is an invitation: nothing changes until the invitee, logged in
-- as the owner of that address, accepts it. One pending invitation per team and address.
CREATE TABLE team_invitations (
    id uuid PRIMARY KEY,
    team_id uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    email text NOT NULL,
    role text NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    invited_by uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    accepted_at timestamptz
);
CREATE UNIQUE INDEX team_invitations_pending ON team_invitations (team_id, lower(email))
    WHERE accepted_at IS NULL;
CREATE INDEX team_invitations_email ON team_invitations (lower(email)) WHERE accepted_at IS NULL;
