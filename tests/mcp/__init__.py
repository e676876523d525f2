"""The mcp suite."""
