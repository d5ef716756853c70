"""Adapters that plug cas_checkpoint into agent frameworks, each behind an extra:
``langgraph`` (``CasSaver``), ``pydantic_ai`` (``CasConversationStore``), ``openai_agents``
(``CasSession``) and ``adk`` (``CasSessionService``, ``CasArtifactService``)."""
