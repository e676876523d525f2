"""The sdk suite."""
