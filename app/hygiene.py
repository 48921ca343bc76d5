"""L3, prefix-cache hygiene: dynamic content in shared system prompts (``schemas/prompt_hygiene.yaml``).

vLLM's automatic prefix caching reuses a prompt's KV blocks only while its prefix is
byte-identical; a timestamp, a date or a user id in the system prompt silently turns every
request into a full prefill. This finds such spans, so the transport can count them, warn once
per distinct prompt, or refuse the request (``STRATA_PROMPT_HYGIENE=reject``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections import OrderedDict
from pathlib import Path

import msgspec
import yaml

logger = logging.getLogger("strata.hygiene")


@functools.lru_cache(maxsize=4096)
def prefix_salt(tenant: str, user: str | None = None) -> str:
    """The ``cache_salt`` vLLM keeps a tenant's prefix-cache blocks apart by (and a user's, in a
    per-user category): equal for one tenant's requests on every worker, so they still share
    their system prompt's blocks, and different across tenants, so that no tenant can time whether
    another's prompt is cached. Strata sets it; a client's own ``cache_salt`` is replaced.
    Memoised: one hash per tenant and user, not per request."""
    scope = tenant if user is None else f"{tenant}\0{user}"
    return hashlib.sha256(b"strata-prefix-salt\0" + scope.encode()).hexdigest()[:32]


class Pattern(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    kind: str
    regex: str
    match: list[str] = msgspec.field(default_factory=list)
    no_match: list[str] = msgspec.field(default_factory=list)


class _File(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    patterns: list[Pattern]


class Finding(msgspec.Struct, frozen=True):
    """One dynamic span: its kind, where it is in the prompt, and the text."""

    kind: str
    start: int
    end: int
    text: str


class PromptHygiene:
    """Finds dynamic content in system prompts; remembers the prompts it already reported.

    Args:
        patterns: The patterns, in the file's order.
        memory: Distinct prompts remembered (their findings are reused, and logged only once).
    """

    def __init__(self, patterns: list[Pattern], memory: int = 4096) -> None:
        self.patterns = patterns
        self._compiled = [(p.kind, re.compile(p.regex, re.IGNORECASE)) for p in patterns]
        self._seen: OrderedDict[str, list[Finding]] = OrderedDict()
        self._memory = memory

    @classmethod
    def load(cls, path: Path) -> PromptHygiene:
        try:
            parsed = msgspec.convert(yaml.safe_load(path.read_text(encoding="utf-8")), _File)
            return cls(parsed.patterns)
        except (OSError, yaml.YAMLError, msgspec.ValidationError, re.error) as exc:
            raise ValueError(f"prompt hygiene patterns {path}: {exc}") from exc

    def find(self, prompt: str) -> list[Finding]:
        """Every dynamic span in a prompt, by position (overlaps keep the first kind listed)."""
        findings: list[Finding] = []
        taken: list[tuple[int, int]] = []
        for kind, regex in self._compiled:
            for match in regex.finditer(prompt):
                if any(match.start() < end and start < match.end() for start, end in taken):
                    continue
                taken.append((match.start(), match.end()))
                findings.append(Finding(kind, match.start(), match.end(), match.group()))
        return sorted(findings, key=lambda f: f.start)

    def check(self, prompt: str) -> tuple[list[Finding], bool]:
        """The findings of a prompt, and whether this prompt is new (not seen before by this worker)."""
        digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
        cached = self._seen.get(digest)
        if cached is not None:
            self._seen.move_to_end(digest)
            return cached, False
        findings = self.find(prompt)
        self._seen[digest] = findings
        if len(self._seen) > self._memory:
            self._seen.popitem(last=False)
        if findings:
            spans = ", ".join(f"{f.kind} {f.text!r} at {f.start}" for f in findings[:5])
            logger.warning("system prompt %s… has dynamic content that defeats vLLM's prefix cache: %s",
                           digest[:12], spans)
        return findings, True
