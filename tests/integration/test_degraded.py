"""With Redis unreachable the service still answers, from the upstream, as a bypass."""

from __future__ import annotations

import httpx

from tests.support import ADMIN_TOKEN, FakeUpstream, chat, free_port, serve_strata, strata_settings


def test_redis_down_means_bypass_and_degraded_health(fake_upstream: FakeUpstream, on_cluster: bool) -> None:
    fake_upstream.reset()
    dead_redis = f"redis+cluster://127.0.0.1:{free_port()}" if on_cluster else f"redis://127.0.0.1:{free_port()}/0"
    with serve_strata(strata_settings(dead_redis, fake_upstream.url)) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        for _ in range(2):
            response = client.post("/v1/chat/completions", json=chat("still answered"))
            assert response.status_code == 200 and response.headers["x-cache"] == "bypass"
            assert response.json()["choices"][0]["message"]["content"].endswith("still answered")
        health = client.get("/health").json()
        assert health["status"] == "degraded" and health["redis"]["status"] == "down"
        refused = client.post("/admin/cache/invalidate", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "cache_unavailable"
        assert 'strata_cache_errors_total{layer="version",operation="read"}' in client.get("/metrics").text
    assert len(fake_upstream.calls) == 2


def test_upstream_down_is_502_and_health_degraded(redis_url: str) -> None:
    dead_upstream = f"http://127.0.0.1:{free_port()}"
    with serve_strata(strata_settings(redis_url, dead_upstream)) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        response = client.post("/v1/chat/completions", json=chat("nobody home"))
        assert response.status_code == 502
        assert response.json()["error"]["type"] == "upstream_error"
        streamed = client.post("/v1/chat/completions", json=chat("nobody home", stream=True))
        assert streamed.status_code == 502
        assert client.get("/health").json()["upstream"]["status"] == "down"
