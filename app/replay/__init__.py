"""``strata replay``: traffic streams with known answers, replayed against Strata.

Modules: ``streams`` (building and reading streams; no numpy), ``simulate`` (an upstream that
answers one answer per label, worded differently each time, and an own Redis Stack), ``run``
(sending a stream, tallying hits by layer and wrong hits, the learning curve and its plot).
"""
