-- A sandbox's egress policy ({"allow": [...], "deny": [...]}, normalized); NULL: none
-- (loopback only). Changed at run time through PUT /v1/sandboxes/{id}/egress-policy.
ALTER TABLE sandboxes ADD COLUMN egress jsonb;
