"""The rules of a governed call, below every surface (the API, the Manage page, MCP, the
CLI's local ``tool test``): who may run what, admission, approvals, idempotency, the
audit of runs and refusals (governor.py), and the rules of secrets, apps and people."""
