-- The vault: each team's data key (wrapped by a versioned key-encryption key from the
-- operator's configuration), the team's secrets (metadata) and their encrypted values.
-- No column holds a plaintext value or key.

CREATE TABLE vault_data_keys (
    team_id     uuid PRIMARY KEY REFERENCES teams (id) ON DELETE CASCADE,
    kek_version integer NOT NULL CHECK (kek_version > 0),
    nonce       bytea NOT NULL,
    wrapped     bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    rotated_at  timestamptz
);
CREATE INDEX vault_data_keys_kek ON vault_data_keys (kek_version);

CREATE TABLE secrets (
    id         uuid PRIMARY KEY,
    team_id    uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name       text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
    -- Hosts the credential is injected for (`api.github.com`, `*.example.org`, `host:8443`).
    hosts      jsonb NOT NULL,
    -- How: {"header": …, "format": …} | {"basic": {"username": …}} | {"query": …} |
    -- {"placeholder": "ENV_NAME"}.
    inject     jsonb NOT NULL,
    version    integer NOT NULL CHECK (version > 0),
    created_by uuid REFERENCES users (id) ON DELETE SET NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, name)
);

CREATE TABLE secret_versions (
    secret_id  uuid NOT NULL REFERENCES secrets (id) ON DELETE CASCADE,
    version    integer NOT NULL CHECK (version > 0),
    team_id    uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    nonce      bytea NOT NULL,
    ciphertext bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (secret_id, version)
);
