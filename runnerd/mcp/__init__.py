"""MCP: the ``/mcp`` endpoint (endpoint.py, loaded with the daemon), the SDK's server behind
its session guard (gateway.py, sessions.py: loaded at the first MCP request)."""

__all__ = ["RPC_METHOD"]

# The scope's key for the JSON-RPC method a POST asks for (None: a notification or a
# response), read once by the endpoint for the session guard, which counts calls.
RPC_METHOD = "runnerd.mcp.method"
