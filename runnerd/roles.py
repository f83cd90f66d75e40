"""Who may do what: the workspace roles, lowest first, and the scopes a token may carry."""

from __future__ import annotations

from typing import Final

__all__ = ["BOUND_SURFACES", "ROLES", "ROLE_RANK", "SCOPES"]

# Each role may do what the roles before it may, and more.
ROLES: Final = ("viewer", "member", "builder", "admin")
ROLE_RANK: Final = {role: rank for rank, role in enumerate(ROLES)}
# api:read lists, tools:run runs tools, apps:write deploys, publishes and installs.
SCOPES: Final = ("api:read", "tools:run", "apps:write")
# The surfaces a token may be bound to when it is made: its runs are recorded as that
# surface whatever a body says (api/surfaces.py), so a relay's write calls always wait.
BOUND_SURFACES: Final = ("relay", "workflow", "chat")
