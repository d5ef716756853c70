"""``cas-checkpoint ui``: a read-only history viewer in the browser (``pip install
'cas_checkpoint[ui]'``). :func:`create_app` makes the ASGI app of a store; ``serve`` runs it
with uvicorn. The library never imports this package; it needs Starlette, Jinja2 and uvicorn."""

from __future__ import annotations

from cas_checkpoint.ui.app import create_app

__all__ = ["create_app"]
