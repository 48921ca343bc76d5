"""L4: ``max_tokens`` learnt from the answers a category really needs.

A request without ``max_tokens`` used to get ``STRATA_DEFAULT_MAX_TOKENS``: a long cap holds KV
blocks for tokens that are never generated, a short one cuts answers. Strata keeps the lengths
(``completion_tokens``) of complete answers per category and model in Redis, shared by every
worker, and once it has ``STRATA_LEARNED_CAP_MIN_ANSWERS`` of them sends ``min(2 x p95,
STRATA_MAX_TOKENS_CAP)`` (the seed's rule). Answers the learnt cap cut (``finish_reason``
``length``) are counted; when they pass 1% of the answers sent with it, the factor widens to 4,
but widening never takes the cap past the default: a model that does not stop by itself would
otherwise be sent ever longer limits and spend more than without L4 (docs/REPLAY.md, first run).
With Redis unavailable the default applies.
"""

from __future__ import annotations

import math
import time

from app.cache.storage.contract import CACHE_ERRORS, SharedRedis
from app.cache.storage.keys import as_text, token_stats_key
from app.metrics import Metrics
from app.settings import LimitSettings

BUCKET = 8  # tokens per histogram bucket (fields b:<n> count answers of n*8 .. n*8+7 tokens)
STATS_TTL_S = 30 * 86400
REFRESH_S = 5.0
FACTOR, WIDE_FACTOR, CUT_SHARE = 2, 4, 0.01
FLOOR = 16  # never below: a cap smaller than a greeting helps nobody


class TokenCaps:
    """The ``max_tokens`` to send when a request names none.

    Args:
        redis: Where the answer lengths live.
        limits: Default and upper bound of ``max_tokens``, and whether and when to learn.
        metrics: Where the learnt caps and the answers they cut are shown.
        refresh_s: How long a worker reuses the statistics it read.
    """

    def __init__(self, redis: SharedRedis, limits: LimitSettings, metrics: Metrics, refresh_s: float = REFRESH_S) -> None:
        self._redis = redis
        self._limits = limits
        self._metrics = metrics
        self._refresh_s = refresh_s
        self._known: dict[str, tuple[float, int | None]] = {}

    async def cap(self, category: str, model: str) -> tuple[int, bool]:
        """(max_tokens, whether it was learnt) for a request of this category and model that named none."""
        default = min(self._limits.default_max_tokens, self._limits.max_tokens_cap)
        if not self._limits.learn_max_tokens:
            return default, False
        key = token_stats_key(category, model)
        now = time.monotonic()
        known = self._known.get(key)
        if known is None or now - known[0] >= self._refresh_s:
            try:
                learnt = self.learnt({str(as_text(k)): int(v) for k, v in (await self._redis.hgetall(key)).items()
                                      if k != b"model"})
            except CACHE_ERRORS as exc:
                self._metrics.cache_failed("token_caps", "read", exc)
                return default, False
            known = (now, learnt)
            if learnt is not None:  # until there are enough answers, every miss looks again
                self._known[key] = known
                self._metrics.learned_max_tokens.labels(category).set(learnt)
        return (known[1], True) if known[1] is not None else (default, False)

    def learnt(self, fields: dict[str, int]) -> int | None:
        """The cap the statistics give, or ``None`` before there are enough answers."""
        answers = fields.get("n", 0)
        if answers < self._limits.learned_cap_min_answers:
            return None
        counts = sorted((int(name[2:]), count) for name, count in fields.items() if name.startswith("b:"))
        needed, seen, p95 = math.ceil(0.95 * answers), 0, 0
        for bucket, count in counts:
            seen += count
            if seen >= needed:
                p95 = (bucket + 1) * BUCKET
                break
        capped, cut = fields.get("capped", 0), fields.get("cut", 0)
        cap = FACTOR * p95
        if capped and cut / capped > CUT_SHARE:
            cap = min(WIDE_FACTOR * p95, max(cap, self._limits.default_max_tokens))
        return max(FLOOR, min(cap, self._limits.max_tokens_cap))

    async def observe(self, category: str, model: str, completion: dict[str, object], learnt: bool) -> None:
        """Count one upstream answer: its length if complete; a cut if the learnt cap cut it."""
        choices = completion.get("choices")
        usage = completion.get("usage")
        if not isinstance(choices, list) or not choices or not isinstance(usage, dict):
            return
        tokens = usage.get("completion_tokens")
        reasons = {c.get("finish_reason") for c in choices if isinstance(c, dict)}
        if not isinstance(tokens, int):
            return
        key = token_stats_key(category, model)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                if reasons == {"stop"}:
                    pipe.hincrby(key, f"b:{tokens // BUCKET}", 1)
                    pipe.hincrby(key, "n", 1)
                if learnt:
                    pipe.hincrby(key, "capped", 1)
                    if "length" in reasons:
                        pipe.hincrby(key, "cut", 1)
                pipe.hset(key, "model", model)
                pipe.expire(key, STATS_TTL_S)
                await pipe.execute()
        except CACHE_ERRORS as exc:
            self._metrics.cache_failed("token_caps", "observe", exc)
            return
        if learnt and "length" in reasons:
            self._metrics.learned_cap_cuts.labels(category).inc()
