"""The drills suite."""
