-- A team may record what its members type in terminal sessions, as its admins' and owners'
-- typing is; off by default (a member's typing may be a password).
ALTER TABLE teams ADD COLUMN record_members_input boolean NOT NULL DEFAULT false;
