"""Adapters that plug cas_checkpoint into agent frameworks (``langgraph``: ``CasSaver``)."""
