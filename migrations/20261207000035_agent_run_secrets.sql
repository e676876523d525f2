-- Credentials given in an agent run's request (a remote MCP server's token), sealed by the
-- vault under the run's team and a label naming the run and the tool, so that the run's
-- tools, events and answers never hold them. Gone with the run.
CREATE TABLE agent_run_secrets (
    run_id uuid NOT NULL REFERENCES agent_runs (id) ON DELETE CASCADE,
    label text NOT NULL,
    nonce bytea NOT NULL,
    sealed bytea NOT NULL,
    PRIMARY KEY (run_id, label)
);
