"""Settings: one frozen object in groups, read from ``STRATA_*`` environment variables.

Every field has one flat name, which is its environment variable without the ``STRATA_``
prefix (``redis.url`` is ``STRATA_REDIS_URL``); the README's table lists every one. Groups are
nested frozen structs whose fields are renamed to those flat names, so ``msgspec`` maps the
flat values onto the groups. Nothing else in the app reads the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec
from msgspec import field

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIX = "STRATA_"
OTEL_STANDARD_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
# Where `make up` keeps the console's admin token (0600) and where `strata keys` writes keys when
# STRATA_KEYS_FILE is unset; `make up` starts Strata with each file that exists.
DEFAULT_ADMIN_TOKEN_FILE = ".run/strata/admin-token"
DEFAULT_KEYS_FILE = ".run/strata/keys.json"


class RedisSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The Redis Stack the cache lives in."""

    url: str = field(default="redis://127.0.0.1:6380/0", name="redis_url")
    # Bounds every Redis call; a slower Redis is treated as a cache miss, not an outage.
    timeout_s: float = field(default=0.25, name="redis_timeout_s")
    max_connections: int = field(default=64, name="redis_max_connections")
    # On a Redis Cluster (``redis+cluster://``): how many buckets the cache is split into; 0 = 3 x
    # the masters. Fixed by the first instance that starts (``strata:meta:buckets``).
    buckets: int = field(default=0, name="redis_buckets")
    # On a cluster: how often the slot map is read again, so buckets follow a failover.
    cluster_refresh_s: float = field(default=1.0, name="redis_cluster_refresh_s")

    @property
    def cluster(self) -> bool:
        return self.url.startswith("redis+cluster://")

    @property
    def shown_url(self) -> str:
        """The URL for logs and messages: a password in it is replaced by ``***``."""
        head, at, where = self.url.rpartition("@")
        if not at or ":" not in head.partition("://")[2]:
            return self.url
        scheme, _, user = head.partition("://")
        return f"{scheme}://{user.partition(':')[0]}:***@{where}"


class UpstreamSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The OpenAI-compatible model server."""

    url: str = field(default="http://127.0.0.1:8000/v1", name="upstream_url")
    api_key: str = field(default="EMPTY", name="upstream_api_key")
    timeout_s: float = field(default=120.0, name="upstream_timeout_s")
    connect_timeout_s: float = field(default=3.0, name="upstream_connect_timeout_s")
    max_retries: int = field(default=1, name="upstream_max_retries")
    # Used for /health only; short so a dead upstream does not stall the probe.
    health_timeout_s: float = field(default=1.0, name="upstream_health_timeout_s")
    # Calls in flight to the model server per worker; more wait up to the queue timeout, then 503.
    max_concurrency: int = field(default=32, name="upstream_max_concurrency")
    queue_timeout_s: float = field(default=10.0, name="upstream_queue_timeout_s")


class SemanticSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The semantic layer: embedder, index schema, verification."""

    enabled: bool = field(default=True, name="semantic_enabled")
    index_schema: str = field(default="schemas/semantic_index.yaml", name="semantic_index_schema")
    embedder: str = field(default="use-multilingual", name="embedder")
    embedder_model: str = field(default="", name="embedder_model")
    # Micro-batching of concurrent embedding requests.
    # 0: texts that arrive while the model runs still go together in the next batch, and a lone
    # lookup does not wait (measured in docs/BENCHMARKS.md: no throughput lost at concurrency 16).
    embed_batch_window_ms: float = field(default=0.0, name="embed_batch_window_ms")
    embed_max_batch: int = field(default=64, name="embed_max_batch")
    # Texts (and characters) one batch takes, and texts waiting per worker before lookups give up
    # at once: the model's time is shared fairly between tenants (app/embed.py).
    embed_max_batch_chars: int = field(default=8_000, name="embed_max_batch_chars")
    embed_max_pending: int = field(default=512, name="embed_max_pending")
    # Longer questions are served by the exact layer only: embedding costs about 30 us a Chinese
    # character (bench/embed_cost.py), and a long text is rarely asked again in other words.
    semantic_max_question_chars: int = field(default=1_000, name="semantic_max_question_chars")
    verification_lexicon: str = field(default="schemas/verification.yaml", name="verification_lexicon")
    # The learned verifier of borderline semantic candidates; empty: none (the band never serves).
    verifier_artifact: str = field(default="schemas/verifier.json", name="verifier_artifact")
    # The LLM judge, for categories whose policy sets `semantic.judge: true`: the model to ask
    # (empty: the model the request names) and how long to wait before rejecting the candidate.
    judge_model: str = field(default="", name="judge_model")
    judge_timeout_s: float = field(default=5.0, name="judge_timeout_s")
    # The grey zone's reader (app/cache/readers, issue #33): an OpenAI-compatible endpoint whose chat model
    # judges candidate pairs for categories with `semantic.reader` (empty: no reader). The model is
    # `judge_model`, else the endpoint's first; its bearer token `judge_api_key`.
    judge_url: str = field(default="", name="judge_url")
    judge_api_key: str = field(default="", name="judge_api_key")
    # A second embedder as the grey zone's reader (app/cache/readers/embedder.py): a sentence-transformers
    # folder (`make reader-model`: .run/models/embeddinggemma-300m) or an OpenAI-compatible
    # /v1/embeddings URL (its model `reader_embedder_model`, else the endpoint's first). It says yes
    # at or above `reader_threshold`, calibrated on the shared QQP pairs (bench/reader_threshold.py:
    # precision 0.949 at 0.88 where USE scores 0.70-0.95); it serves only where it was measured.
    reader_embedder: str = field(default="", name="reader_embedder")
    reader_embedder_model: str = field(default="", name="reader_embedder_model")
    reader_threshold: float = field(default=0.88, name="reader_threshold")
    reader_embedder_threads: int = field(default=1, name="reader_embedder_threads")
    # What the teams' intent heads read (issue #46): empty, the index's own vectors; else a second
    # embedder as `reader_embedder` takes it (EmbeddingGemma: `make reader-model`), with its
    # classification prompt. Heads are fitted on it and a head of another is not served; the
    # index, its KNN and its floor stay on `embedder`. It embeds each question of a category with
    # a head loaded once more (about 27 ms with EmbeddingGemma on this CPU, docs/QUALITY.md).
    intent_embedder: str = field(default="", name="intent_embedder")
    intent_embedder_model: str = field(default="", name="intent_embedder_model")
    intent_embedder_threads: int = field(default=1, name="intent_embedder_threads")
    # What the heads of English files read when `intent_embedder` names none (issue #58): the
    # all-MiniLM-L6-v2 that `strata intents export-reader` writes (make up does; int8 through
    # onnxruntime, 2.5 ms a question), if that folder is there; a file in another language, or
    # "off" here, reads the index's vectors. The load says which one a head reads.
    intent_reader_en: str = field(default=".run/models/minilm-l6-onnx-int8", name="intent_reader_en")
    # Reads after the response in flight per worker (a quarter of them per tenant at most).
    reader_max_pending: int = field(default=64, name="reader_max_pending")
    # How long a worker reuses an adaptive category's pooled observations before reading them again.
    learning_refresh_s: float = field(default=1.0, name="learning_refresh_s")
    # Observations (and async judge calls) in flight per worker; beyond it new ones are dropped.
    learning_max_pending: int = field(default=256, name="learning_max_pending")
    # Checks of served hits asked of the model after the response (policy `intent_first_check`), in
    # flight per worker; 0 asks none (a model that answers one sequence at a time has no room
    # for them beside its answers: `make up MODEL=qwen1.5b`).
    max_hit_checks: int = field(default=4, name="max_hit_checks")


class LimitSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds on what a request may ask and how often."""

    default_max_tokens: int = field(default=256, name="default_max_tokens")
    max_tokens_cap: int = field(default=1024, name="max_tokens_cap")
    max_body_bytes: int = field(default=1_048_576, name="max_body_bytes")
    # A request body must arrive within this (408 otherwise), and nest at most max_json_depth deep.
    body_timeout_s: float = field(default=10.0, name="body_timeout_s")
    max_json_depth: int = field(default=64, name="max_json_depth")
    max_messages: int = field(default=256, name="max_messages")
    max_content_chars: int = field(default=65_536, name="max_content_chars")
    tenant_rps: float = field(default=0.0, name="tenant_rps")  # 0: no limit
    tenant_burst: float = field(default=0.0, name="tenant_burst")  # 0: equal to tenant_rps
    # L4: learn max_tokens per category and model for requests that name none (app/token_caps.py).
    learn_max_tokens: bool = field(default=True, name="learn_max_tokens")
    learned_cap_min_answers: int = field(default=50, name="learned_cap_min_answers")


_GROUPS: dict[str, type[msgspec.Struct]] = {
    "redis": RedisSettings, "upstream": UpstreamSettings, "semantic": SemanticSettings, "limits": LimitSettings,
}


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Runtime configuration of the Strata service."""

    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    log_level: str = "info"
    admin_token: str | None = None
    # The admin token's file when ``admin_token`` is unset (``make up`` writes .run/strata/admin-token,
    # 0600); re-read when it changes, so a rotation ends the old token's sessions.
    admin_token_file: str = ""
    # Failed console sign-ins allowed per client address and per token prefix in a window; past
    # it, sign-in answers 429 with Retry-After until the window ends.
    console_signin_attempts: int = 10
    console_signin_window_s: int = 300
    # The proxies whose X-Forwarded-For / X-Forwarded-Proto are believed (comma-separated addresses
    # or networks, "*" for any). Empty: none, so every client is the peer that connected, and the
    # sign-in lock, the per-address limits and the audit see the real peer (docs/SECURITY.md).
    trusted_proxies: str = ""
    # /metrics behind ``Authorization: Bearer <token>`` when set (it names categories and tenants);
    # ``metrics_tenant_labels`` false puts every tenant in one series (``tenant="-"``).
    metrics_token: str | None = None
    metrics_tenant_labels: bool = True
    # Tenants: API keys file (empty: one default tenant, no client auth).
    keys_file: str = ""
    policy_file: str = "schemas/policy.yaml"
    # Bounds each layer's whole lookup (Redis, and the embedding for the semantic layer): past
    # it the request goes on to the upstream as a bypass.
    lookup_timeout_s: float = 0.25
    # L3: dynamic content in system prompts (schemas/prompt_hygiene.yaml): off, warn (count and log
    # once per distinct prompt) or reject (400 with the span found).
    prompt_hygiene: Literal["off", "warn", "reject"] = "warn"
    prompt_hygiene_file: str = "schemas/prompt_hygiene.yaml"
    # L3 per tenant: send vLLM a ``cache_salt`` derived from the tenant (and the user, in a per-user
    # category), so no tenant's requests reuse, or time, another's prefix-cache blocks.
    cache_salt: bool = True
    # Single flight: one upstream call per identical miss, across workers. The leader renews its
    # lease every quarter of it, so a dead leader's followers go on within lease_s.
    singleflight_lease_s: float = 2.0
    singleflight_poll_s: float = 0.02
    # /v1/embeddings responses are cached exactly this long (0: not cached).
    embeddings_ttl_s: int = 86_400
    # How long a hit's response can be given feedback (POST /v1/feedback): its id's lifetime (0: never).
    feedback_ttl_s: int = 86_400
    # The secrets hits' response ids are signed with, comma-separated: the first signs, all verify
    # (rotation). Empty: one secret made once and kept in Redis (app/cache/learning/receipts.py).
    response_id_secrets: str = ""
    # OpenTelemetry traces (app/tracing.py): an OTLP/HTTP endpoint (its base, or its /v1/traces);
    # empty: the standard OTEL_EXPORTER_OTLP_ENDPOINT if set, else no tracing at all.
    otel_endpoint: str = ""
    otel_service_name: str = "strata"
    # Whether spans may carry the questions' text (off: rule, similarity and verdict only).
    otel_capture_text: bool = False

    redis: RedisSettings = field(default_factory=RedisSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    semantic: SemanticSettings = field(default_factory=SemanticSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)

    @classmethod
    def flat_names(cls) -> list[str]:
        """Every setting's flat name (its variable is ``STRATA_`` + the name in capitals)."""
        names = [f.encode_name for f in msgspec.structs.fields(cls) if f.name not in _GROUPS]
        for group in _GROUPS.values():
            names += [f.encode_name for f in msgspec.structs.fields(group)]
        return names

    @classmethod
    def from_flat(cls, values: Mapping[str, Any], *, strict: bool = True) -> Settings:
        """Build settings from flat names (``redis_url=...``), as tests and the environment give them.

        Args:
            values: Values by flat name; a name that is no setting is an error.
            strict: Whether values must have their field's type (false: strings are parsed).

        Raises:
            ValueError: An unknown name, or a value that is not of its field's type.
        """
        unknown = set(values) - set(cls.flat_names())
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        try:
            groups = {
                name: msgspec.convert(
                    {f.encode_name: values[f.encode_name] for f in msgspec.structs.fields(group) if f.encode_name in values},
                    group, strict=strict,
                )
                for name, group in _GROUPS.items()
            }
            top = {k: v for k, v in values.items() if k in cls.__struct_fields__}
            return msgspec.convert({**top, **groups}, cls, strict=strict, from_attributes=True)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid {ENV_PREFIX}* setting: {exc}") from exc

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
        for name in cls.flat_names():
            value = environ.get(ENV_PREFIX + name.upper())
            if value is None:
                continue
            raw[name] = None if value == "" and name in ("admin_token", "metrics_token") else value
        # The one variable read without the prefix: OpenTelemetry's own, as tracing systems set it.
        if not raw.get("otel_endpoint") and environ.get(OTEL_STANDARD_ENDPOINT):
            raw["otel_endpoint"] = environ[OTEL_STANDARD_ENDPOINT]
        return cls.from_flat(raw, strict=False)

    def resolve(self, path: str) -> Path:
        """Resolve a configured path relative to the project root."""
        candidate = Path(path)
        return candidate if candidate.is_absolute() else PROJECT_ROOT / candidate
