"""The store suite."""
