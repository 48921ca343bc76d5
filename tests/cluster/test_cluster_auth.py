"""A cluster whose nodes require a password: the URL's credentials reach the cluster client and
every bucket's connection; without them Strata answers from the model (bypass)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.conftest import LocalCluster, local_cluster
from tests.support import FakeUpstream, ask, serve_strata, strata_settings

PASSWORD = "s3cret-for-tests"


@pytest.fixture(scope="module")
def protected() -> Iterator[LocalCluster]:
    with local_cluster(password=PASSWORD) as cluster:
        yield cluster


def test_the_urls_password_opens_every_bucket(protected: LocalCluster, upstream: FakeUpstream, use_encoder: Any) -> None:
    nodes = ",".join(f"127.0.0.1:{port}" for port in protected.ports)
    with serve_strata(strata_settings(f"redis+cluster://:{PASSWORD}@{nodes}", upstream.url, semantic_enabled=True),
                      use_encoder) as strata:
        for tenant_question in ("怎么申请退款", "how do i get a refund"):
            assert ask(strata.url, tenant_question).headers["x-cache"] == "miss"
            assert ask(strata.url, tenant_question).headers["x-cache"] == "exact-hit"
        assert ask(strata.url, "退款怎么申请").headers["x-cache"] == "semantic-hit"
    with serve_strata(strata_settings(f"redis+cluster://{nodes}", upstream.url)) as strata:
        assert ask(strata.url, "怎么申请退款").headers["x-cache"] == "bypass"  # refused: no cache, still answered
