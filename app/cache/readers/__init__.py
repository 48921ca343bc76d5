"""Readers of the grey zone (issue #33): whatever reads both questions and says whether the
cached answer answers the new one. One contract (:class:`app.cache.readers.base.Reader`) and one
LLM judge (judge.py); the adaptive decision asks a reader and trusts it only as far as its
verdicts were measured (app/cache/decision/rules.py). Imports storage only.
"""
