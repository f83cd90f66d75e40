"""govern."""
