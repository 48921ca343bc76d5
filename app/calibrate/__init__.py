"""Calibration of the semantic layer on labelled question pairs: ``strata calibrate``.

A pair ``(sentence1, sentence2, label)`` reads: ``sentence1`` is cached, ``sentence2`` arrives in
the same scope; label 1 means the cached answer is right for it. Every decision here is made by
:meth:`app.cache.decision.verify.PairVerifier.verify` (and the judge step by
:meth:`app.cache.decision.verify.CandidateCheck.confirmed`), the code path the service runs.

Modules: ``pairs`` (CSV, splits; no numpy), ``qqp`` (QQP-hard), ``evaluate``, ``fit``, ``plot``
and ``train``. ``plot`` needs matplotlib and ``qqp`` and ``train`` scikit-learn, from the
``calibrate`` extra (``pip install -e ".[calibrate]"``; ``make train-verifier`` installs it).
"""
