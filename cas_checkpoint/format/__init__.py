"""The bytes on storage, pure: ids, the value codec, object kinds, heads, packs."""
