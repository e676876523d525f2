-- Agent runs' approval rules, and the decisions made on their calls ({call_id, tool, rule,
-- decision, remember, reason, by}). `cancel_scope` also takes 'tool:CALL_ID' (that call
-- only: the turn goes on).
ALTER TABLE agent_runs
    ADD COLUMN approvals jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN decisions jsonb NOT NULL DEFAULT '[]';
