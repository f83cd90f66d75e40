"""The Content-Security-Policy of every answer the daemon sends (runnerd/daemon/middleware
adds it), here where the Manage page's own answer can extend it (it may frame the apps
origin) without importing the daemon."""

from __future__ import annotations

__all__ = ["CSP"]

# No inline script or style, nothing from another origin, no framing.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
