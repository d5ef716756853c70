"""Keeping a store: retention, repack, gc, rekey, stats and verify, as steps."""
