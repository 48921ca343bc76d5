"""Where the cache lives: one Redis, or the buckets of a Redis Cluster.

RediSearch 2.10 has no cross-shard coordinator: an index sees only the master that owns its
name's slot, and a script may touch one slot only. So on a cluster the cache is split into
buckets (docs/SCALING.md). A bucket is a hash tag (``b7``) and the master that owns its slot:
every key of the bucket (entries, aliases, its index, its copies of the version tag and of the
scope generations) starts with ``strata:{b7}:``, and all of it is reached through a plain
connection to that master, where it behaves exactly as a single Redis. A request's bucket is
chosen by its tenant and category, so everything a lookup can match (the scope's entries and
the tenant's curated answers) is in one bucket and a lookup is one KNN query.

The tags are chosen once, spread evenly over the masters, and stored in
``strata:meta:buckets`` so every instance, and every later start, uses the same ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from app.cache.storage.keys import BUCKETS_KEY, KEYS, Keyspace, as_text
from app.settings import RedisSettings

logger = logging.getLogger("strata.buckets")

CLUSTER_SCHEME = "redis+cluster"
# Bucket tags are probed in this order (b0, b1, ...); 16,384 slots make a few dozen enough.
MAX_TAG_PROBES = 100_000
# Reads of the slot map at start-up before serving without the cache: the fail-fast timeout is
# for requests; one slow answer while a busy machine starts must not cost a cache-less interval.
STARTUP_ATTEMPTS = 3


class ClusterUnavailable(ConnectionError):
    """The cluster's slot map could not be read (a cache failure, like any unreachable Redis)."""


@dataclass
class Bucket:
    """One keyspace and the connection its keys live on.

    Attributes:
        keys: The keyspace (``strata`` on one Redis, ``strata:{b7}`` in a cluster bucket).
        redis: A connection to the Redis holding every key of the keyspace; on a cluster it
            follows the bucket's slot to another master (a failover), see :meth:`Buckets.follow`.
        address: ``host:port`` of that Redis now.
        tag: The bucket's hash tag on a cluster (``b7``), else empty.
    """

    keys: Keyspace
    redis: Redis
    address: str
    tag: str = ""


class BucketPool(ConnectionPool):
    """The connections of one cluster bucket, which can be moved to another node: after a
    failover every component keeps its client, and the client talks to the new master."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()

    def make_connection(self) -> Any:
        connection = super().make_connection()
        self._made.add(connection)
        return connection

    async def move_to(self, host: str, port: int) -> None:
        """Point every connection, idle, busy or future, at ``host:port`` (busy ones reconnect
        on their next command: the failed one is a cache failure, counted as a miss)."""
        self.connection_kwargs.update(host=host, port=port)
        for connection in list(self._made):
            connection.host, connection.port = host, port
        await self.disconnect(inuse_connections=True)


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """The start-up nodes of ``redis+cluster://host:port[,host:port...]``.

    Raises:
        ValueError: Not a cluster URL, or a node without a port.
    """
    parts = urlsplit(url)
    if parts.scheme != CLUSTER_SCHEME or not parts.netloc:
        raise ValueError(f"not a cluster URL: {url!r} (redis+cluster://host:port[,host:port])")
    nodes = []
    for node in parts.netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = node.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"a cluster node needs host:port, got {node!r}")
        nodes.append((host, int(port)))
    return nodes


def cluster_credentials(url: str) -> dict[str, str]:
    """``username`` and ``password`` of ``redis+cluster://user:secret@host:port,...`` (none given: empty)."""
    parts = urlsplit(url)
    found = {"username": parts.username, "password": parts.password}
    return {name: unquote(value) for name, value in found.items() if value}


def choose_tags(count: int, owner: Callable[[str], str], masters: Sequence[str]) -> list[str]:
    """``count`` hash tags spread evenly over the masters (``b0``, ``b1``, ... probed in order).

    Args:
        count: Buckets wanted.
        owner: The master (``host:port``) owning a hash tag's slot.
        masters: Every master.

    Returns:
        The tags, in an order that takes each master in turn.
    """
    per_master: dict[str, list[str]] = {master: [] for master in masters}
    share = -(-count // len(masters))
    for probe in range(MAX_TAG_PROBES):
        if sum(len(tags) for tags in per_master.values()) >= share * len(masters):
            break
        tag = f"b{probe}"
        found = per_master.get(owner(tag))
        if found is not None and len(found) < share:
            found.append(tag)
    rounds = [per_master[master] for master in masters]
    interleaved = [tags[i] for i in range(share) for tags in rounds if i < len(tags)]
    if len(interleaved) < count:
        raise RuntimeError(f"found tags for {len(interleaved)} of {count} buckets")
    return interleaved[:count]


def master_of(cluster: RedisCluster, tag: str) -> tuple[str, int]:
    """(host, port) of the master owning a hash tag's slot in the slot map last read.

    Raises:
        ClusterUnavailable: No node owns the slot (a cluster in the middle of a change).
    """
    node = cluster.get_node_from_key(f"{{{tag}}}")
    if node is None:
        raise ClusterUnavailable(f"no master owns the slot of {{{tag}}}")
    return str(node.host), int(node.port)


def bucket_of(tenant: str, category: str, count: int) -> int:
    """The bucket of a (tenant, category): every entry a request of it can match lives there."""
    digest = hashlib.sha256(f"{tenant}\x1f{category}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


class Buckets:
    """The buckets of the cache and how requests find theirs.

    Args:
        buckets: The buckets; one, with the plain keyspace, on a single Redis; none on a cluster
            not reached yet (:meth:`offline`).
        shared: The client for keys that belong to no bucket (usage counts, L4's statistics,
            the audit stream, leases): the single Redis, or the cluster client.
        clustered: Whether the buckets are a cluster's.
    """

    def __init__(self, buckets: Sequence[Bucket], shared: Redis | RedisCluster | None, *, clustered: bool) -> None:
        if not buckets and not clustered:
            raise ValueError("one Redis is one bucket")
        self.all = tuple(buckets)
        self.shared = shared
        self.clustered = clustered
        self._by_namespace = {bucket.keys.namespace: i for i, bucket in enumerate(self.all)}

    @classmethod
    def offline(cls) -> Buckets:
        """A cluster that did not answer at start-up: no buckets yet, every request a bypass."""
        return cls((), None, clustered=True)

    async def follow(self) -> int:
        """Re-read the cluster's slot map and move each bucket's connection to the master that
        owns its slot now (a replica promoted after a failover, or a resharding). Returns how
        many buckets moved; nothing to do on a single Redis."""
        if not self.clustered:
            return 0
        assert isinstance(self.shared, RedisCluster)
        await self.shared.nodes_manager.initialize()
        moved = 0
        for bucket in self.all:
            host, port = master_of(self.shared, bucket.tag)
            address = f"{host}:{port}"
            if address != bucket.address:
                logger.warning("bucket %s moved from %s to %s", bucket.keys.namespace, bucket.address, address)
                pool = bucket.redis.connection_pool
                assert isinstance(pool, BucketPool)
                await pool.move_to(host, port)
                bucket.address = address
                moved += 1
        return moved

    def of(self, tenant: str, category: str) -> int:
        """The index of the bucket holding a tenant's category."""
        return 0 if len(self.all) == 1 else bucket_of(tenant, category, len(self.all))

    def holding(self, key: str) -> int | None:
        """The index of the bucket a key of Strata's belongs to, by its namespace; ``None`` if none."""
        if not self.clustered:
            return 0
        head, _, rest = key.partition("}")
        return self._by_namespace.get(head + "}") if rest.startswith(":") else None

    async def aclose(self) -> None:
        """Close every connection."""
        closing: dict[int, Any] = {id(bucket.redis): bucket.redis for bucket in self.all}
        if self.shared is not None:
            closing[id(self.shared)] = self.shared
        await asyncio.gather(*(client.aclose() for client in closing.values()), return_exceptions=True)


def connect_redis(settings: RedisSettings, **where: Any) -> Redis:
    """A Redis client that fails fast: a slow or absent Redis must cost a miss, not a stall.

    Args:
        settings: Timeouts and pool size; its URL unless ``where`` names host and port.
        **where: ``host`` and ``port`` of one cluster bucket's master (its own, movable pool).
    """
    options: dict[str, Any] = {
        "socket_timeout": settings.timeout_s, "socket_connect_timeout": settings.timeout_s,
        # One immediate retry: it replaces a pooled connection that died with a Redis restart.
        "retry": Retry(NoBackoff(), 1), "health_check_interval": 30,
    }
    if where:
        # redisvl's search replies are parsed as RESP2 (redis-py 8 defaults to RESP3 on clusters).
        pool = BucketPool(host=where["host"], port=where["port"], protocol=2,
                          max_connections=settings.max_connections, **cluster_credentials(settings.url), **options)
        return Redis(connection_pool=pool)
    return Redis.from_url(settings.url, max_connections=settings.max_connections, **options)


async def open_buckets(settings: RedisSettings) -> Buckets:
    """The buckets of ``settings.url``: one for a single Redis, several on a cluster.

    On a cluster nothing is read or written beyond the slot map and ``strata:meta:buckets``.

    Raises:
        ValueError: A malformed cluster URL.
        ClusterUnavailable: The cluster could not be reached (cluster mode needs its slot map
            to start; on one Redis, Strata starts without Redis and bypasses the cache).
    """
    if not settings.cluster:
        redis = connect_redis(settings)
        return Buckets([Bucket(KEYS, redis, settings.url)], redis, clustered=False)
    nodes = [ClusterNode(host, port) for host, port in cluster_nodes(settings.url)]
    for attempt in range(1, STARTUP_ATTEMPTS + 1):
        credentials = cluster_credentials(settings.url)
        cluster = RedisCluster(startup_nodes=nodes, protocol=2, socket_timeout=settings.timeout_s,
                               socket_connect_timeout=settings.timeout_s, max_connections=settings.max_connections,
                               username=credentials.get("username"), password=credentials.get("password"))
        try:
            await cluster.initialize()
            masters = sorted(f"{node.host}:{node.port}" for node in cluster.get_primaries())

            def owner(tag: str, cluster: RedisCluster = cluster) -> str:
                host, port = master_of(cluster, tag)
                return f"{host}:{port}"

            tags = await _stored_tags(cluster, settings.buckets or 3 * len(masters), owner, masters)
            break
        except (RedisError, RedisClusterException, OSError) as exc:
            await cluster.aclose()
            if attempt == STARTUP_ATTEMPTS:
                raise ClusterUnavailable(f"Redis Cluster {settings.shown_url}: cannot read its slot map ({exc!r}, "
                                         f"{attempt} attempts); cluster mode needs the cluster at start-up") from exc
            logger.warning("Redis Cluster %s: slot map read %d of %d failed (%r), trying again",
                           settings.shown_url, attempt, STARTUP_ATTEMPTS, exc)
        except BaseException:
            await cluster.aclose()
            raise
    buckets = []
    for tag in tags:
        # A pool per bucket, not per master: after a resharding, buckets of one master may part.
        address = owner(tag)
        host, _, port = address.rpartition(":")
        buckets.append(Bucket(Keyspace.bucket(tag), connect_redis(settings, host=host, port=int(port)), address, tag))
    logger.info("Redis Cluster: %d masters, %d buckets (%s)", len(masters), len(buckets),
                ", ".join(f"{b.keys.namespace}@{b.address}" for b in buckets))
    return Buckets(buckets, cluster, clustered=True)


async def _stored_tags(cluster: RedisCluster, count: int, owner: Callable[[str], str], masters: list[str]) -> list[str]:
    """The bucket tags every instance uses: the stored ones, or ``count`` new ones stored now."""
    stored = await cluster.get(BUCKETS_KEY)
    if stored is None:
        await cluster.set(BUCKETS_KEY, ",".join(choose_tags(count, owner, masters)), nx=True)
        stored = await cluster.get(BUCKETS_KEY)
    tags = str(as_text(stored)).split(",")
    if len(tags) != count:
        logger.warning("the cluster holds %d buckets (%s); STRATA_REDIS_BUCKETS=%d is ignored: changing the "
                       "count would move every tenant's entries", len(tags), BUCKETS_KEY, count)
    return tags
