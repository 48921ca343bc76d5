"""Scope isolation of the semantic layer, property-based, against real Redis Stack and the real
embedder: no tenant or model name, however adversarial, widens or breaks the KNN filter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cache.semantic import SemanticCache
from app.cache.storage.contract import CacheQuery
from app.cache.storage.index import scope_filter
from app.cache.storage.keys import canonicalize, faq_scope_digest
from app.embed import BatchingEmbedder
from app.policy import CategoryPolicy, FixedSemantic
from app.settings import PROJECT_ROOT
from app.wire import ChatCompletionRequest
from tests.support import first_bucket

CATEGORY = CategoryPolicy(name="faq", ttl_seconds=600, semantic=FixedSemantic(threshold=0.80, accept_above=0.97))
# Names built from everything the RediSearch query syntax gives meaning to, plus Unicode.
SPECIAL = [*"|*-{}@ \"'\\,.<>[]():;!#$%^&=~/?+\t", "退款", "é", "\u3000", "ﬁ"]
names = st.lists(st.sampled_from(SPECIAL) | st.text(min_size=1, max_size=3), min_size=1, max_size=6).map("".join)


class Harness:
    """The semantic layer on its own, over the test Redis, on a private event loop."""

    def __init__(self, redis_url: str, encoder: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.redis, self.keys = self.run(first_bucket(redis_url))
        self.embedder = BatchingEmbedder(encoder)
        self.cache = SemanticCache(self.redis, self.embedder, PROJECT_ROOT / "schemas" / "semantic_index.yaml",
                                   keys=self.keys)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def query(self, question: str, *, tenant: str = "t", model: str = "m", system: str = "S") -> CacheQuery:
        raw = {"model": model, "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
        canonical = canonicalize(
            msgspec.convert(raw, ChatCompletionRequest), raw, tenant=tenant, category=CATEGORY.name, max_tokens=64
        )
        return CacheQuery(canonical=canonical, category=CATEGORY, version="v1")

    def store(self, query: CacheQuery, answer: str) -> None:
        # Entries are written under their version only while it is current (as the service would have it).
        self.run(self.redis.set(self.keys.version_key, 1, nx=True))
        self.run(self.cache.store(query, msgspec.json.encode({"answer": answer})))

    def lookup(self, query: CacheQuery) -> str | None:
        hit = self.run(self.cache.lookup(query))
        return None if hit is None else msgspec.json.decode(hit.completion)["answer"]

    def close(self) -> None:
        self.run(self.redis.aclose())
        self.embedder.close()
        self.loop.close()


@pytest.fixture
def harness(redis_url: str, redis_sync: redis.Redis, use_encoder: Any) -> Iterator[Harness]:
    h = Harness(redis_url, use_encoder)
    yield h
    h.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tenant_a=names, tenant_b=names, model=names)
def test_tenants_never_see_each_other(harness: Harness, tenant_a: str, tenant_b: str, model: str) -> None:
    if tenant_a == tenant_b:
        return
    harness.run(harness.redis.flushall())
    harness.cache.forget_index("v1")
    asked = "怎么申请退款"
    harness.store(harness.query(asked, tenant=tenant_a, model=model), f"for {tenant_a!r}")
    # The same tenant finds its own entry, so escaping did not break the filter ...
    assert harness.lookup(harness.query("退款怎么申请", tenant=tenant_a, model=model)) == f"for {tenant_a!r}"
    # ... and no other tenant finds it, with the identical question and so an identical vector.
    assert harness.lookup(harness.query(asked, tenant=tenant_b, model=model)) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model_a=names, model_b=names, system=names)
def test_models_and_system_prompts_never_see_each_other(harness: Harness, model_a: str, model_b: str, system: str) -> None:
    if model_a == model_b:
        return
    harness.run(harness.redis.flushall())
    harness.cache.forget_index("v1")
    harness.store(harness.query("How do I reset my password?", model=model_a, system=system), "a")
    assert harness.lookup(harness.query("How do I reset my password?", model=model_a, system=system)) == "a"
    assert harness.lookup(harness.query("How do I reset my password?", model=model_b, system=system)) is None
    assert harness.lookup(harness.query("How do I reset my password?", model=model_a, system=system + "!")) is None


def test_the_filter_reaches_redis_as_a_digest_not_as_client_text(harness: Harness) -> None:
    query = harness.query('怎么退款 @scope:{*}', tenant='evil"} | @scope:{*', model="*) -@tenant:{x")
    digest = query.canonical.scope_digest
    assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")
    curated = faq_scope_digest(query.canonical.tenant, "faq")  # the tenant's curated answers (strata faq load)
    assert set(curated) <= set("0123456789abcdef")
    assert str(scope_filter(query)) == f"(@scope:{{{digest}|{curated}}} @category:{{faq}})"
