-- Which store models a key may call: glob patterns such as `openai/*` (NULL: any). A call
-- must be allowed by the key and by every ancestor that has a list.
ALTER TABLE api_keys ADD COLUMN allowed_models text[];
