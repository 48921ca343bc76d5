"""Storage: the keys, entries, versions and buckets of the cache in Redis, the exact layer, the
semantic index and its KNN, invalidation and the usage counts. The lowest room of ``app.cache``:
it imports no other room (tests/unit/test_layout.py)."""
