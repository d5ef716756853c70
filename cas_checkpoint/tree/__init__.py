"""A state <-> a tree of content-addressed nodes (structural sharing), pure."""
