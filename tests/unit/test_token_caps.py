"""L4 arithmetic: the learnt cap from answer lengths, its widening, its bounds."""

from __future__ import annotations

from app.metrics import Metrics
from app.settings import LimitSettings
from app.token_caps import TokenCaps

LIMITS = LimitSettings(default_max_tokens=256, max_tokens_cap=1024, learned_cap_min_answers=100)


def caps() -> TokenCaps:
    return TokenCaps(redis=None, limits=LIMITS, metrics=Metrics())  # type: ignore[arg-type]


def test_twice_the_p95_once_there_are_enough_answers() -> None:
    # 100 answers: 90 of 40-47 tokens (bucket 5), 10 of 96-103 (bucket 12): p95 falls in bucket 12.
    fields = {"n": 100, "b:5": 90, "b:12": 10}
    assert caps().learnt(fields) == 2 * 13 * 8
    assert caps().learnt({"n": 99, "b:5": 99}) is None  # too few: the default applies


def test_it_widens_when_it_cuts_more_than_one_percent_and_stays_in_bounds() -> None:
    fields = {"n": 100, "b:5": 100, "capped": 200}
    assert caps().learnt({**fields, "cut": 2}) == 2 * 48  # 1%: not more than 1%
    assert caps().learnt({**fields, "cut": 3}) == 4 * 48
    # Widening stops at the default (256): answers that do not end are not sent longer limits.
    long = {"n": 100, "b:14": 100, "capped": 200, "cut": 50}  # p95 120: 2 x p95 = 240, 4 x p95 = 480
    assert caps().learnt(long) == 256
    assert caps().learnt({"n": 100, "b:39": 100, "capped": 200, "cut": 50}) == 640  # 2 x p95 above the default: kept
    assert caps().learnt({"n": 100, "b:0": 100}) == 16  # never below the floor
    assert caps().learnt({"n": 100, "b:300": 100}) == 1024  # never above STRATA_MAX_TOKENS_CAP


def test_redis_down_means_the_default() -> None:
    import asyncio

    from redis.exceptions import ConnectionError as RedisConnectionError

    class Down:
        async def hgetall(self, key: str) -> dict[bytes, bytes]:
            raise RedisConnectionError("down")

    metrics = Metrics()
    caps = TokenCaps(redis=Down(), limits=LIMITS, metrics=metrics)  # type: ignore[arg-type]
    assert asyncio.run(caps.cap("faq", "m")) == (256, False)
    assert metrics.cache_errors.labels("token_caps", "read")._value.get() == 1
