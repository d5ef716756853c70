"""Google ADK on a cas_checkpoint store: ``CasSessionService`` (``pip install
'cas_checkpoint[adk]'``).

    service = CasSessionService("s3://bucket/agents")   # or "./sessions", "memory://x"
    runner = Runner(agent=agent, app_name="app", session_service=service)

``register()`` adds the URI schemes ``cas+file``, ``cas+memory`` and ``cas+s3`` to ADK's service
registry (``adk web --session_service_uri cas+s3://bucket/agents``).
"""

from __future__ import annotations

from typing import Any

from cas_checkpoint.integrations.adk.artifacts import CasArtifactService
from cas_checkpoint.integrations.adk.sessions import CasSessionService

SCHEMES = ("cas+file", "cas+memory", "cas+s3")


def _url(uri: str) -> str:
    url = uri.removeprefix("cas+")
    return url.removeprefix("file://") if url.startswith("file://") else url


def register(registry: Any = None) -> None:
    """Let ADK build ``CasSessionService`` from ``cas+<store URL>`` URIs (``registry``:
    ADK's global service registry when None)."""
    if registry is None:
        from google.adk.cli.service_registry import get_service_registry

        registry = get_service_registry()
    for scheme in SCHEMES:
        registry.register_session_service(
            scheme, lambda uri, **kw: CasSessionService(_url(uri)))


__all__ = ["CasArtifactService", "CasSessionService", "register"]
