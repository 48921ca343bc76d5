"""Readers of the grey zone (issue #33): whatever reads both questions and says whether the
cached answer answers the new one. One contract (:class:`app.readers.base.Reader`); the adaptive
decision asks it and trusts it only as far as its verdicts were measured (app/cache/adaptive.py).
"""
