"""The infra suite."""
