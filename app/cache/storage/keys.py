"""Key layout, field names and the canonical form of a request: the one place they are defined.

Redis key layout (every name readable with ``redis-cli``)::

    strata:meta:version            STRING  current version number N; the tag is "vN"
    strata:meta:embedder           STRING  the embedder of the stored vectors (another one bumps N)
    strata:meta:scopes             HASH    invalidation counters: category:<c>, tenant:<t>,
                                           category:<c>|tenant:<t> (absent = 0); see app/cache/storage/version.py
    strata:meta:audit              STREAM  every invalidation: who, what, when (capped)
    strata:meta:usage:<YYYYMMDDHHMM>  HASH requests per <category>|<outcome> in that UTC minute (2 h TTL)
    strata:meta:layers:<YYYYMMDDHHMM> HASH the same minute per tenant and answering layer (exact,
                                           semantic, curated, miss, bypass, error), for the console:
                                           n|<layer>|<category>|<tenant> requests, ms|... their summed
                                           milliseconds, le<ms>|... how many took at most <ms> (2 h TTL)
    strata:vN:exact:<sha256>       HASH    L1 entry (fields below), TTL from the category
    strata:vN:sem:<sha256>         HASH    L2 entry, indexed by the RediSearch index strata:vN:sem
    strata:vN:lease:<sha256>       STRING  single-flight lease while one worker asks the model
    strata:vN:emb:<sha256>         HASH    a /v1/embeddings response (answer, model, tenant, created_at, hits)
    strata:vN:obs:<category>:<tenant>
                                   HASH    a tenant's pooled observations in an adaptive category (ok:<bin>,
                                           wrong:<bin>): what that tenant's decisions read, and only that
    strata:vN:obs:<category>       HASH    the same over all tenants: for /health and /metrics only
    strata:meta:tokens:<category>:<model sha256[:16]>
                                   HASH    L4: completion lengths of complete answers (b:<bucket of 8>, n,
                                           capped, cut), for the learned max_tokens
    strata:vN:sem:faq-<sha256>     HASH    a curated answer (`strata faq load`), or one of its variants
    strata:vN:faqset:<name>        SET     the keys one `strata faq load` file wrote (replaced on reload)
    strata:vN:wording:<sha256>     SET     one wording's exact entries in a tenant's category (whatever the
                                           system prompt, parameters, user or protocol), so a curated answer
                                           removes them all; its member `curated` while a curated answer owns
                                           the wording, and no model answer to it is stored (app/curated.py)
    strata:meta:response_id_secret STRING  the secret hits' response ids are signed with, when
                                           STRATA_RESPONSE_ID_SECRETS is unset (app/cache/learning/receipts.py)
    strata:fb:<nonce>              STRING  the verdict given on one response (POST /v1/feedback), until
                                           its id expires (STRATA_FEEDBACK_TTL_S): one per response.
                                           A hit writes nothing: its id carries what served it
    strata:meta:intents:<category>:<tenant>
                                   HASH    a team's intent head (`strata intents load`): meta (JSON: intents,
                                           shared flags, calibrated threshold, embedder, measures), weights
                                           and bias (float32 bytes); strata:meta:intents-generation counts changes
    strata:meta:intents-file:<category>:<tenant>
                                   STRING  the labelled phrasings it was fitted on (JSON), for `strata intents refit`
    strata:meta:intents-refit:<category>:<tenant>
                                   STRING  the console's last refit (JSON: state running|done|failed, who, when,
                                           what the load said); while running, it is the lock (TTL 15 minutes)
    strata:console:ended:<session id>
                                   STRING  a console session signed out: refused until it would have
                                           expired anyway (its TTL), so the table never outgrows the sessions
    strata:console:signin:<addr|prefix>:<sha256[:16]>
                                   STRING  failed console sign-ins from one client address, or with one
                                           token prefix, in the current window (its TTL)

On a Redis Cluster (``STRATA_REDIS_URL=redis+cluster://...``) the cache is split into buckets
(app/cache/storage/buckets.py), each a hash tag such as ``b7`` listed in ``strata:meta:buckets`` (STRING,
comma-separated). Every key above except the usage and layer counts, L4's statistics, the response-id
secret, the verdicts and the audit stream then lives in a bucket, with the tag after the namespace,
and the version and scope counters are per bucket::

    strata:{b7}:meta:version       strata:{b7}:meta:scopes      strata:{b7}:meta:embedder
    strata:{b7}:vN:exact:<sha256>  strata:{b7}:vN:sem:<sha256>  (index strata:{b7}:vN:sem) ...

Prefixes end with ``:`` and none is a prefix of another (``strata:v1:sem:`` does not match
``strata:v10:sem:``), because RediSearch matches index prefixes as plain string prefixes.
"""

from __future__ import annotations

import hashlib
import re
import time
import unicodedata
from typing import Any

import msgspec

from app.wire import ChatCompletionRequest, ContentPart

NAMESPACE = "strata"
AUDIT_KEY = f"{NAMESPACE}:meta:audit"
# The secret response ids are signed with when none is configured (app/cache/learning/receipts.py).
RESPONSE_SECRET_KEY = f"{NAMESPACE}:meta:response_id_secret"
# The intent heads the teams loaded (`strata intents load`): one hash per category and tenant, and a
# counter every load or removal bumps, so every worker reloads within seconds (app/cache/storage/intents.py).
INTENTS_PREFIX = f"{NAMESPACE}:meta:intents:"
INTENTS_GENERATION_KEY = f"{NAMESPACE}:meta:intents-generation"
# The console's sessions signed out, and its failed sign-ins (app/web/guard.py).
CONSOLE_ENDED_PREFIX = f"{NAMESPACE}:console:ended:"
CONSOLE_SIGNIN_PREFIX = f"{NAMESPACE}:console:signin:"
# On a Redis Cluster: the hash tags of the cache's buckets, chosen by the first instance.
BUCKETS_KEY = f"{NAMESPACE}:meta:buckets"
# The generation of a (category, tenant) no targeted invalidation has touched: its keys are the
# canonical digests themselves.
NO_GENERATION = "0.0.0"

# Hash fields, shared by the exact and the semantic layers.
FIELD_QUESTION = "question"
FIELD_ANSWER = "answer"
FIELD_MODEL = "model"
FIELD_TENANT = "tenant"
# The user an entry of a per-user category (scope: user) belongs to; absent in shared categories.
FIELD_USER = "user"
FIELD_CATEGORY = "category"
FIELD_SCOPE = "scope"
FIELD_CREATED_AT = "created_at"
FIELD_EXPIRES_AT = "expires_at"
FIELD_HITS = "hits"
FIELD_EMBEDDING = "embedding"
# The (category, tenant) generation an entry was stored under, so a sweep can tell it is stale.
FIELD_GENERATION = "generation"
# Semantic documents: the entry whose answer a document serves (itself, or the entry an alias
# belongs to), the aliases an entry has, and what it learnt: observation counts per score bin
# (``ok:<bin>``, ``wrong:<bin>``) and the highest similarity (x1000) of a wrong observation.
FIELD_ROOT = "root"
# Where a semantic document's answer comes from: SOURCE_MODEL (absent) or SOURCE_FAQ.
FIELD_SOURCE = "source"
SOURCE_MODEL = "model"
SOURCE_FAQ = "faq"
FIELD_ALIASES = "aliases"
FIELD_WRONG_ABOVE = "wrong_above"
# A semantic document's intent, as the tenant's intent head read its question when it was stored
# (or the team's own label, for a curated answer of an intent), and how sure the head was.
FIELD_INTENT = "intent"
FIELD_INTENT_CONFIDENCE = "intent_confidence"
# The head's probability of every intent it gave the question at LIKELY_FLOOR or above, as JSON
# ({"intent": 0.62, ...}): the veto reads from it how likely two questions are to share an intent.
FIELD_INTENT_LIKELY = "intent_likely"
# Set (1) on a document and its entry when a hit the intent rule served from them was measured
# wrong (explored, or a user's "wrong"): the answer is not its intent's, whatever the head reads
# in the question, so the rule serves it no more (a load's relabelling keeps it).
FIELD_INTENT_REFUTED = "intent_refuted"
# Set (1) on a document and its entry once the model's answer to a question the intent rule served
# from them agreed with theirs: with `intent_first_check`, the rule's first hit of an entry is
# checked after the response (a load that reads another intent in its question removes it).
FIELD_INTENT_CHECKED = "intent_checked"
OBS_OK = "ok"
OBS_WRONG = "wrong"
# On an entry: equivalent observations of any of its documents per score bin (its own record).
OBS_CONFIRMED = "confirmed"
# A response's receipt (app/cache/learning/receipts.py): which layer, version and document served it, at
# which similarity and score bin.
FIELD_LAYER = "layer"
FIELD_VERSION = "version"
FIELD_DOCUMENT = "document"
FIELD_SIMILARITY = "similarity"
FIELD_SCORE_BIN = "score_bin"
FIELD_VERDICT = "verdict"
OBS_EXPLORED_OK = "explored_ok"
OBS_EXPLORED_WRONG = "explored_wrong"
# In a pool: how the rules that vouch beside the pool fared, per score bin, counted against the
# model's answer (issue #33: each is trusted only where it was measured): ``record_ok:<bin>`` /
# ``record_wrong:<bin>`` when an entry's record vouched, ``reader_ok:<bin>`` / ``reader_wrong:<bin>``
# when a reader said yes; ``reader_no_ok:<bin>`` / ``reader_no_wrong:<bin>``: a reader's no, when
# the answer was the candidate's after all, or was not (its lost reach, its refusals that were
# right). Its yes and no together give its rates on pairs of one answer and of two.
OBS_RECORD_OK = "record_ok"
OBS_RECORD_WRONG = "record_wrong"
OBS_READER_OK = "reader_ok"
OBS_READER_WRONG = "reader_wrong"
OBS_READER_NO_OK = "reader_no_ok"
OBS_READER_NO_WRONG = "reader_no_wrong"
# ``intent_ok:<bin>`` / ``intent_wrong:<bin>``: the team's intent rule's explored hits (issue #46).
OBS_INTENT_OK = "intent_ok"
OBS_INTENT_WRONG = "intent_wrong"
# ``intent_ok_of:<intent>`` / ``intent_wrong_of:<intent>``: the same hits per intent, so that one
# intent whose answers are measured wrong (a label error, an answer that depends on what the
# question names) is set aside alone (app/cache/decision/rules.py, ``intents_refuted``).
OBS_INTENT_OK_OF = "intent_ok_of"
OBS_INTENT_WRONG_OF = "intent_wrong_of"
# ``intent_trial_ok:<bin>`` / ``intent_trial_wrong:<bin>``: the intent rule on trial (issue #58
# item 6): pairs it would have served had its head certified anything, answered by the model.
OBS_INTENT_TRIAL_OK = "intent_trial_ok"
OBS_INTENT_TRIAL_WRONG = "intent_trial_wrong"
# ``intent_probation_ok_of:<intent>`` / ``intent_probation_wrong_of:<intent>``: the intent rule's
# hits served on probation (a file too small to certify its threshold, or below the certified
# one), checked by the model after the response; an intent, or the rule, stops once its record
# shows more than the bound (an anytime-valid test: app/cache/decision/stats.py).
OBS_INTENT_PROBATION_OK_OF = "intent_probation_ok_of"
OBS_INTENT_PROBATION_WRONG_OF = "intent_probation_wrong_of"
# ``intent_probation_ok:<hundredth>`` / ``intent_probation_wrong:<hundredth>``: the same checks by
# the pair's lower confidence: the rule stops from the confidence down where its record shows more
# than the bound, and serves on above it.
OBS_INTENT_PROBATION_OK = "intent_probation_ok"
OBS_INTENT_PROBATION_WRONG = "intent_probation_wrong"
# ``intent_far_ok`` / ``intent_far_wrong``: the probation hits served from a cached question further
# from the asked one than ``intent_beyond_floor`` (down to ``intent_far_floor``), checked by the
# model; counted here alone, so that a far pair's wrong answer stops the far serves, not its
# intent's or its confidence's near ones.
OBS_INTENT_FAR_OK = "intent_far_ok"
OBS_INTENT_FAR_WRONG = "intent_far_wrong"
# The rules whose verdicts are counted so (a candidate's ``vouched``).
VOUCH_RECORD = "record"
VOUCH_READER = "reader"
VOUCH_INTENT = "intent"
# A hit the intent rule served on probation: feedback's "wrong" counts on its intent's probation record.
VOUCH_PROBATION = "probation"

# Request fields that never change what the model answers: left out of keys and scopes.
NON_OUTPUT_FIELDS = frozenset(
    {"stream", "stream_options", "user", "request_id", "metadata", "store", "service_tier", "priority", "cache_salt",
     "safety_identifier", "prompt_cache_key"}
)
# Fields that carry the conversation or are normalised separately.
_STRUCTURAL_FIELDS = frozenset({"model", "messages", "max_tokens", "max_completion_tokens"})
# Numeric fields whose JSON spelling (1 vs 1.0) must not change the key.
_FLOAT_FIELDS = frozenset({"temperature", "top_p", "frequency_penalty", "presence_penalty", "min_p"})

_key_encoder = msgspec.json.Encoder(order="deterministic")


def scope_fields(category: str, tenant: str) -> tuple[str, str, str]:
    """The fields of ``strata:meta:scopes`` whose counters make up a (category, tenant) generation."""
    return f"category:{category}", f"tenant:{tenant}", f"category:{category}|tenant:{tenant}"


def generation_of(values: list[Any] | tuple[Any, ...]) -> str:
    """``"c.t.p"`` from the three counters as HMGET returns them (absent counts 0)."""
    return ".".join((v.decode() if isinstance(v, bytes) else str(v)) if v is not None else "0" for v in values)


def with_generation(digest: str, generation: str) -> str:
    """A digest under a generation: itself until the first targeted invalidation of its scope."""
    return digest if generation == NO_GENERATION else _digest([digest, generation])


def usage_key(minute: int) -> str:
    """Requests per category and outcome in one UTC minute (``minute`` = Unix seconds // 60)."""
    return f"{NAMESPACE}:meta:usage:{time.strftime('%Y%m%d%H%M', time.gmtime(minute * 60))}"


def layers_key(minute: int) -> str:
    """Requests per tenant, category and answering layer in one UTC minute, with their latency."""
    return f"{NAMESPACE}:meta:layers:{time.strftime('%Y%m%d%H%M', time.gmtime(minute * 60))}"


def version_tag(version: int) -> str:
    return f"v{version}"


def token_stats_key(category: str, model: str) -> str:
    """L4 statistics of one category and model (across versions: answer lengths outlive a bump)."""
    return f"{NAMESPACE}:meta:tokens:{category}:{hashlib.sha256(model.encode('utf-8')).hexdigest()[:16]}"


def faq_scope_digest(tenant: str, category: str) -> str:
    """The scope of curated answers: a tenant's category, whatever the model, prompt or parameters."""
    return _digest(["faq", tenant, category])


# The member of a wording set (``Keyspace.wording_key``) while a curated answer owns that wording.
CURATED_MARK = "curated"
_NOT_A_WORD = re.compile(r"[\W_]+")


def fold_wording(text: str) -> str:
    """A question up to case, spaces and punctuation: what makes two askings one wording."""
    return _NOT_A_WORD.sub("", text.casefold())


# The name of a curated-answer file (``strata faq load --name``), part of its set's key.
FAQ_SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Keyspace(msgspec.Struct, frozen=True):
    """The names of one cache's keys: one Redis (``strata``), or one bucket of a Redis Cluster
    (``strata:{b3}``: the hash tag puts every key, the version and generation copies and the
    index of the bucket in one slot, so every script and index of the bucket works unchanged).

    Attributes:
        namespace: What every key of this cache starts with.
    """

    namespace: str = NAMESPACE

    @classmethod
    def bucket(cls, tag: str) -> Keyspace:
        """The keyspace of a cluster bucket whose hash tag is ``tag``."""
        return cls(f"{NAMESPACE}:{{{tag}}}")

    @property
    def version_key(self) -> str:
        return f"{self.namespace}:meta:version"

    @property
    def scopes_key(self) -> str:
        return f"{self.namespace}:meta:scopes"

    @property
    def embedder_key(self) -> str:
        return f"{self.namespace}:meta:embedder"

    @property
    def versioned(self) -> str:
        """What every versioned key and index name starts with (``strata:v``), for sweeps."""
        return f"{self.namespace}:v"

    def exact_prefix(self, tag: str) -> str:
        return f"{self.namespace}:{tag}:exact:"

    def semantic_prefix(self, tag: str) -> str:
        return f"{self.namespace}:{tag}:sem:"

    def semantic_index_name(self, tag: str) -> str:
        return f"{self.namespace}:{tag}:sem"

    def embeddings_key(self, tag: str, digest: str) -> str:
        return f"{self.namespace}:{tag}:emb:{digest}"

    def lease_key(self, tag: str, digest: str) -> str:
        """The single-flight lease of a request being answered (short-lived)."""
        return f"{self.namespace}:{tag}:lease:{digest}"

    def faq_key(self, tag: str, digest: str) -> str:
        return f"{self.semantic_prefix(tag)}faq-{digest}"

    def faq_set_key(self, tag: str, name: str) -> str:
        return f"{self.namespace}:{tag}:faqset:{name}"

    def wording_key(self, tag: str, tenant: str, category: str, question: str) -> str:
        """The exact entries of one wording in a tenant's category (and the curated mark)."""
        return f"{self.namespace}:{tag}:wording:{_digest(['wording', tenant, category, fold_wording(question)])}"

    def review_key(self, tag: str, category: str, tenant: str) -> str:
        """A tenant's review queue in a category (app/cache/learning/review.py): item id -> times asked."""
        return f"{self.namespace}:{tag}:review:{category}:{tenant}"

    def review_item_key(self, tag: str, identifier: str) -> str:
        """One item of a review queue: both questions, both answers, the similarity."""
        return f"{self.namespace}:{tag}:review-item:{identifier}"

    def observations_key(self, tag: str, category: str, tenant: str | None = None) -> str:
        """Pooled observations of an adaptive category: one tenant's (what its decisions read:
        one tenant's traffic never moves what another is served), or with ``tenant=None`` every
        tenant's together (what the live-precision figures of /health and /metrics read)."""
        pool = f"{self.namespace}:{tag}:obs:{category}"
        return pool if tenant is None else f"{pool}:{tenant}"


def verdict_key(nonce: str) -> str:
    """The verdict given on one response (its receipt's nonce, app/cache/learning/receipts.py): one per
    response. Outside any bucket and version: feedback names the response, not where it came from."""
    return f"{NAMESPACE}:fb:{nonce}"


def observation_field(result: str, score_bin: int) -> str:
    """``ok:087``: zero-padded so that ``HGETALL`` lists the bins in order."""
    return f"{result}:{score_bin:03d}"


def intent_field(same: bool, intent: str) -> str:
    """``intent_wrong_of:card_lost``: one intent's measured intent hits in a tenant's pool."""
    return f"{OBS_INTENT_OK_OF if same else OBS_INTENT_WRONG_OF}:{intent}"


def probation_field(same: bool, intent: str) -> str:
    """``intent_probation_wrong_of:card_lost``: one intent's checked probation hits."""
    return f"{OBS_INTENT_PROBATION_OK_OF if same else OBS_INTENT_PROBATION_WRONG_OF}:{intent}"


# The keyspace of a single Redis (and of the tools that read one).
KEYS = Keyspace()


# Full-width ASCII (U+FF01-U+FF5E) and the ideographic space: the same characters typed on a
# CJK keyboard. Nothing else is folded: NFKC would also fold superscripts, fractions, circled
# and Roman numerals and unit symbols ("2³" into "23"), merging questions that differ.
_WIDTH_FOLD = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)} | {0x3000: 0x20}


def as_text(value: object) -> str | None:
    """A value as Redis hands it back (bytes, or str from a decoding client) as text; ``None``
    stays ``None``. The one place such values are decoded."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_text(text: str) -> str:
    """NFC, full-width ASCII as ASCII, trimmed: only what cannot change a question's meaning."""
    return unicodedata.normalize("NFC", text).translate(_WIDTH_FOLD).strip()


def _normalize_content(content: Any) -> Any:
    """A message's content as the key sees it: texts normalised, every other part (image_url with
    its url and detail, input_audio, file, unknown types) kept whole, as the client sent it."""
    if content is None or isinstance(content, str):
        return None if content is None else normalize_text(content)
    if not isinstance(content, list):
        return content
    return [
        {**part, "text": normalize_text(part["text"])}
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) else part
        for part in content
    ]


def _normalize_message(message: dict[str, Any]) -> dict[str, Any]:
    """Every field of a message as sent (name, tool_calls, refusal, audio, ...), its content normalised."""
    normalized = {name: value for name, value in message.items() if value is not None}
    normalized["content"] = _normalize_content(message.get("content"))
    return normalized


def text_of(content: str | list[ContentPart] | None) -> str | None:
    """The plain text of a message, or ``None`` when it has non-text parts (images, audio, files)."""
    if content is None or isinstance(content, str):
        return content
    if any(part.type != "text" or part.text is None for part in content):
        return None
    return "\n".join(part.text for part in content if part.text is not None)


def _digest(value: Any) -> str:
    return hashlib.sha256(_key_encoder.encode(value)).hexdigest()


class CanonicalRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What decides the answer, normalised; everything else in a request is ignored by keys.

    Attributes:
        tenant: The tenant the request belongs to.
        user: The user the answer belongs to in a category of ``scope: user``; ``None`` in a
            category whose answers the tenant's users share.
        category: The content category: its TTL bounds the age of any answer served for it,
            so an answer stored under a long-lived category must not serve a short-lived one.
        model: The requested model.
        params: Every output-affecting parameter; ``max_tokens`` as the client limited it (after
            the cap), or ``None`` when it named no limit (Strata then picks one, L4, and only
            complete answers are stored, which do not depend on it).
        system: The leading system and developer messages.
        history: Every message after those and before the last one, in order.
        last: The last message.
        question: The normalised text of the last message when it is a user's text question.
    """

    tenant: str
    user: str | None = None
    category: str
    model: str
    params: dict[str, Any]
    system: list[dict[str, Any]]
    history: list[dict[str, Any]]
    last: dict[str, Any]
    question: str | None

    @property
    def exact_digest(self) -> str:
        """sha256 of the whole canonical request: the L1 key suffix."""
        return _digest(self)

    @property
    def scope_digest(self) -> str:
        """sha256 of everything but the last question: what a semantic match must share."""
        return _digest([self.tenant, self.user, self.category, self.model, self.params, self.system, self.history])


def canonicalize(
    request: ChatCompletionRequest, raw: dict[str, Any], *, tenant: str, category: str, max_tokens: int | None,
    user: str | None = None,
) -> CanonicalRequest:
    """Build the canonical form of a validated request.

    Args:
        request: The validated request.
        raw: The request as received, holding the pass-through fields too.
        tenant: The tenant the request is served for.
        category: The content category's name.
        max_tokens: The client's ``max_tokens`` after the cap, or ``None`` when it sent none.
        user: The user of a user-scoped category, ``None`` in a shared one.

    Returns:
        The canonical request; equal for requests that must share a cache entry.
    """
    params: dict[str, Any] = {"max_tokens": max_tokens}
    for name, value in raw.items():
        if name in NON_OUTPUT_FIELDS or name in _STRUCTURAL_FIELDS or value is None:
            continue
        params[name] = float(value) if name in _FLOAT_FIELDS and isinstance(value, int) else value
    # From the body as sent: the validated view declares only what Strata reads, and every part
    # and field of a message can change the answer.
    messages = [_normalize_message(m) for m in raw["messages"]]
    # The leading system/developer messages form the (shared, prefix-cached) system prompt;
    # everything after them, in order, is the conversation so far.
    leading = 0
    while leading < len(messages) - 1 and messages[leading]["role"] in ("system", "developer"):
        leading += 1
    system, history = messages[:leading], messages[leading:-1]
    last_message = request.messages[-1]
    question = None
    # The semantic layer compares texts: a conversation with an image, audio or a file anywhere
    # is served only by its exact key.
    if last_message.role == "user" and all(text_of(m.content) is not None for m in request.messages):
        text = text_of(last_message.content)
        question = normalize_text(text) if text is not None else None
    return CanonicalRequest(
        tenant=tenant,
        user=user,
        category=category,
        model=request.model,
        params=params,
        system=system,
        history=history,
        last=messages[-1],
        question=question,
    )


def intents_file_key(category: str, tenant: str) -> str:
    """The labelled phrasings a tenant's head was fitted on (JSON), kept for ``strata intents refit``."""
    return f"{NAMESPACE}:meta:intents-file:{category}:{tenant}"


def intents_refit_key(category: str, tenant: str) -> str:
    """The console's last refit of a tenant's head (JSON), and its lock while it runs."""
    return f"{NAMESPACE}:meta:intents-refit:{category}:{tenant}"


def intents_key(category: str, tenant: str) -> str:
    """A tenant's intent head in a category (the tenant last: a ``:`` in its name splits nothing)."""
    return f"{INTENTS_PREFIX}{category}:{tenant}"
