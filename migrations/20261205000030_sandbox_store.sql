-- Store access from inside sandboxes: the hash of a sandbox's store credential (the node's
-- egress proxy adds it to the sandbox's requests to the store host; the sandbox never holds
-- it), and runs that ask for store access. (`store_requests.sandbox_id` names the sandbox a
-- call came from.)
ALTER TABLE sandboxes ADD COLUMN store_token_hash bytea;
CREATE UNIQUE INDEX sandboxes_store_token ON sandboxes (store_token_hash)
    WHERE store_token_hash IS NOT NULL;
ALTER TABLE runs ADD COLUMN store boolean NOT NULL DEFAULT false;
