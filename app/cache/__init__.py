"""The cache, in rooms that import only downwards (tests/unit/test_layout.py checks it):

1. ``storage``: keys, entries, versions, buckets, the exact layer, the semantic index, invalidation, usage;
2. ``readers``: readers of the grey zone (one contract, one LLM judge);
3. ``decision``: guards, verifier, the adaptive rules and their statistics;
4. ``learning``: observations, answer equivalence, aliases and merges, feedback, review, receipts;
5. this package's own modules, which put them together: ``semantic`` (L2), ``layered`` (L1 + L2,
   write-back and learning after the response) and ``routed`` (the buckets of a Redis Cluster).

Every layer follows the contract in :mod:`app.cache.storage.contract`.
"""
