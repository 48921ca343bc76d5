"""Settings: one frozen object, read from ``STRATA_*`` environment variables.

Every field can be overridden by the environment variable ``STRATA_<FIELD NAME IN CAPITALS>``;
the README lists them. Nothing else in the app reads the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIX = "STRATA_"


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Runtime configuration of the Strata service."""

    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    log_level: str = "info"

    redis_url: str = "redis://127.0.0.1:6380/0"
    # Bounds every Redis call; a slower Redis is treated as a cache miss, not an outage.
    redis_timeout_s: float = 0.25
    # Bounds each layer's whole lookup (Redis, and the embedding for the semantic layer): past
    # it the request goes on to the upstream as a bypass.
    lookup_timeout_s: float = 0.25
    redis_max_connections: int = 64

    upstream_url: str = "http://127.0.0.1:8000/v1"
    upstream_api_key: str = "EMPTY"
    upstream_timeout_s: float = 120.0
    upstream_connect_timeout_s: float = 3.0
    upstream_max_retries: int = 1
    # Used for /health only; short so a dead upstream does not stall the probe.
    upstream_health_timeout_s: float = 1.0
    # Calls in flight to the model server per worker; more wait up to the queue timeout, then 503.
    upstream_max_concurrency: int = 32
    upstream_queue_timeout_s: float = 10.0

    default_max_tokens: int = 256
    max_tokens_cap: int = 1024
    max_body_bytes: int = 1_048_576
    max_messages: int = 256
    max_content_chars: int = 65_536

    # Tenants: API keys file (empty: one default tenant, no client auth) and request budget.
    keys_file: str = ""
    tenant_rps: float = 0.0  # 0: no limit
    tenant_burst: float = 0.0  # 0: equal to tenant_rps

    # Single flight: one upstream call per identical miss, across workers.
    singleflight_lease_s: float = 130.0
    singleflight_poll_s: float = 0.02

    policy_file: str = "schemas/policy.yaml"
    semantic_index_schema: str = "schemas/semantic_index.yaml"
    verification_lexicon: str = "schemas/verification.yaml"
    # The learned verifier of borderline semantic candidates; empty: none (the band never serves).
    verifier_artifact: str = "schemas/verifier.json"
    # The LLM judge, for categories whose policy sets `semantic.judge: true`: the model to ask
    # (empty: the model the request names) and how long to wait before rejecting the candidate.
    judge_model: str = ""
    judge_timeout_s: float = 5.0
    admin_token: str | None = None

    semantic_enabled: bool = True
    embedder: str = "use-multilingual"
    embedder_model: str = ""
    # Micro-batching of concurrent embedding requests.
    embed_batch_window_ms: float = 2.0
    embed_max_batch: int = 64

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``STRATA_*`` variables; unknown variables are ignored.

        Args:
            environ: The environment to read; ``os.environ`` when omitted.

        Returns:
            The validated settings.

        Raises:
            ValueError: A variable does not parse as its field's type.
        """
        environ = os.environ if environ is None else environ
        raw: dict[str, str | None] = {}
        for name in cls.__struct_fields__:
            value = environ.get(ENV_PREFIX + name.upper())
            if value is None:
                continue
            raw[name] = None if value == "" and name == "admin_token" else value
        try:
            return msgspec.convert(raw, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid {ENV_PREFIX}* setting: {exc}") from exc

    def resolve(self, path: str) -> Path:
        """Resolve a configured path relative to the project root."""
        candidate = Path(path)
        return candidate if candidate.is_absolute() else PROJECT_ROOT / candidate
