"""Learning: what the cache learns after a response. Observations and what each kind counts
(observations.py), answer equivalence, aliases and merges (learner.py), end users' feedback and
the receipts it names (feedback.py, receipts.py), the review queue (review.py). Imports storage,
readers and decision."""
