-- The operator's vault: credentials of the deployment itself (the store's providers, paid
-- APIs and MCP servers), which no team ever reads. Each value is sealed directly by the
-- current key-encryption key, bound to its name; `sandbase vault rotate-kek` re-seals them.

CREATE TABLE operator_secrets (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
    kek_version integer NOT NULL CHECK (kek_version > 0),
    nonce       bytea NOT NULL,
    ciphertext  bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
