"""The openapi suite."""
