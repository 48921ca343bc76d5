"""Decision: whether a cached answer may serve another question. The guards and the verifier
(verify.py), the adaptive rules in their order (rules.py, adaptive.py), and their statistics:
Wilson bounds, score bins, pooled counts, live figures (stats.py). Imports storage and readers."""
