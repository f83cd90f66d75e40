"""The HTTP API (starlette): routes, the error envelope, access and load limits."""
