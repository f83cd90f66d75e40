"""Checks of values against a tool's schemas, in time linear in the value: JSON Schema
compiled for linear-time engines, nesting caps, and checker threads with a time budget."""
