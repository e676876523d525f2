#!/usr/bin/env bash
# Regenerates src/sandbase/models.py from the OpenAPI document (`sandbase openapi`): pydantic 2
# models, enums as literal type aliases. scripts/test runs it and fails if the file changes.
set -euo pipefail
cd "$(dirname "$0")/../.."
target/debug/sandbase openapi > target/openapi.json
.venv/bin/datamodel-codegen --input target/openapi.json --input-file-type openapi \
  --output sdk/python/src/sandbase/models.py --output-model-type pydantic_v2.BaseModel \
  --target-python-version 3.10 --use-annotated --use-standard-collections \
  --use-union-operator --field-constraints --disable-timestamp --enum-field-as-literal all \
  --use-schema-description --use-type-alias --formatters builtin 2>/dev/null
