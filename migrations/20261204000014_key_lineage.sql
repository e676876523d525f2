-- A key made by a key is its child: `lineage` lists its ancestors, nearest first. Its cap,
-- expiry and role are bounded by its parent's when it is made, revoking a key revokes the
-- keys whose lineage holds it, and spending is counted against every key of the lineage.
ALTER TABLE api_keys ADD COLUMN lineage uuid[] NOT NULL DEFAULT '{}';
CREATE INDEX api_keys_lineage ON api_keys USING gin (lineage);
