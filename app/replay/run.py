"""Sending a stream to Strata and tallying what it did: hits by layer, wrong hits (an answer
generated for another label), upstream calls, and the learning curve per window."""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from app.replay.streams import Request

LAYERS = ("exact-hit", "semantic-hit", "miss", "bypass")
WRONG_KINDS = ("first_meeting", "twin", "repeat")


class Poster(Protocol):
    """What the replay needs of an HTTP client (httpx's or Litestar's test client)."""

    async def post(self, url: str, *, json: Any, headers: dict[str, str]) -> Any: ...


@dataclass
class Replayed:
    """One replayed request: the layer that answered, the label asked and the label served."""

    layer: str
    label: str
    served_label: str | None  # the label whose answer was served (hits only): a miss produced it, or a curated one
    seconds: float
    text: str = ""
    similarity: float | None = None
    # For a wrong hit, which kind (WRONG_KINDS): nothing cached could have answered the asker
    # (``first_meeting``), an answer of the asker's label was cached but another one served
    # (``twin``: the hard case), or this very question was served wrongly before (``repeat``).
    wrong_kind: str | None = None
    verdict: str | None = None  # X-Cache-Verdict of a semantic hit: the rule that served it
    # The semantic lookup's decision, from its trace (``verdict|rule|...``; "" without one): why a miss missed.
    decision: str = ""

    @property
    def wrong(self) -> bool:
        return self.layer.endswith("-hit") and self.served_label is not None and self.served_label != self.label


@dataclass
class Report:
    """What a replay measured."""

    outcomes: list[Replayed] = field(default_factory=list)
    errors: int = 0
    feedback: int = 0  # wrong hits reported by the asker (POST /v1/feedback)
    reviews: dict[str, int] = field(default_factory=dict)  # queue items a simulated reviewer settled, by verdict
    model_calls: int | None = None  # what the simulated model answered: misses and checks of served hits
    # The tenant's pool at the end of a simulated replay: its fields and counts (the rules' records).
    pool: dict[str, int] = field(default_factory=dict)

    def count(self, layer: str, part: Sequence[Replayed] | None = None) -> int:
        return sum(1 for o in (self.outcomes if part is None else part) if o.layer == layer)

    def wrong(self, layer: str, part: Sequence[Replayed] | None = None) -> int:
        return sum(1 for o in (self.outcomes if part is None else part) if o.layer == layer and o.wrong)

    def wrong_kinds(self) -> dict[str, int]:
        """Wrong semantic hits by kind (``WRONG_KINDS``)."""
        kinds = [o.wrong_kind for o in self.outcomes if o.layer == "semantic-hit" and o.wrong]
        return {kind: kinds.count(kind) for kind in WRONG_KINDS}

    def semantic_by_verdict(self) -> dict[str, tuple[int, int]]:
        """Semantic hits by the rule that served them (``X-Cache-Verdict``): (served, wrong)."""
        tally: dict[str, list[int]] = {}
        for o in self.outcomes:
            if o.layer == "semantic-hit":
                counts = tally.setdefault(o.verdict or "unknown", [0, 0])
                counts[0] += 1
                counts[1] += o.wrong
        return {verdict: (served, wrong) for verdict, (served, wrong) in sorted(tally.items())}

    def windows(self, size: int) -> list[dict[str, Any]]:
        rows = []
        for start in range(0, len(self.outcomes), size):
            part = self.outcomes[start : start + size]
            semantic = self.count("semantic-hit", part)
            rows.append({
                "requests": f"{start + 1}-{start + len(part)}",
                "exact": self.count("exact-hit", part) / len(part),
                "semantic": semantic / len(part),
                "semantic_wrong": self.wrong("semantic-hit", part) / semantic if semantic else 0.0,
                "upstream": self.count("miss", part) + self.count("bypass", part),
            })
        return rows

    def summary(self, window: int) -> str:
        total = len(self.outcomes)
        lines = [f"requests: {total}, errors: {self.errors}, wrong hits reported by feedback: {self.feedback}"]
        if self.reviews:
            lines.append("review queue settled: " + ", ".join(f"{k} {v}" for k, v in sorted(self.reviews.items())))
        for layer in LAYERS:
            n = self.count(layer)
            lines.append(f"  {layer:<13} {n:>6}  {n / max(1, total):7.2%}")
        semantic, exact = self.count("semantic-hit"), self.count("exact-hit")
        lines.append(f"wrong hits: semantic {self.wrong('semantic-hit')} of {semantic} "
                     f"({self.wrong('semantic-hit') / max(1, semantic):.2%}), exact {self.wrong('exact-hit')} of {exact}")
        kinds = self.wrong_kinds()
        lines.append("wrong semantic hits by kind: " + ", ".join(f"{kind} {kinds[kind]}" for kind in WRONG_KINDS))
        lines.append("semantic hits by verdict (wrong): " + ", ".join(
            f"{verdict} {served} ({wrong})" for verdict, (served, wrong) in self.semantic_by_verdict().items()))
        upstream = self.count('miss') + self.count('bypass')
        checks = f" (and {self.model_calls - upstream} checks of served hits, after the response)" \
            if self.model_calls is not None and self.model_calls > upstream else ""
        lines.append(f"upstream calls: {upstream}{checks}")
        lines.append(f"learning curve (per {window} requests): window, exact, semantic, wrong share of semantic, upstream")
        for row in self.windows(window):
            lines.append(f"  {row['requests']:>11}  {row['exact']:6.1%}  {row['semantic']:6.1%}  "
                         f"{row['semantic_wrong']:6.2%}  {row['upstream']:>5}")
        lines.append(f"semantic={semantic / max(1, total):.4f} wrong_of_semantic={self.wrong('semantic-hit') / max(1, semantic):.4f} "
                     f"exact={exact / max(1, total):.4f} upstream={self.count('miss') + self.count('bypass')}")
        return "\n".join(lines)

    def to_json(self, window: int) -> bytes:
        total = max(1, len(self.outcomes))
        return msgspec.json.format(msgspec.json.encode({
            "requests": len(self.outcomes), "errors": self.errors, "feedback": self.feedback, "reviews": self.reviews,
            "layers": {layer: self.count(layer) / total for layer in LAYERS},
            "semantic_wrong": self.wrong("semantic-hit"), "exact_wrong": self.wrong("exact-hit"), "model_calls": self.model_calls,
            "semantic_wrong_by_kind": self.wrong_kinds(),
            "semantic_by_verdict": {verdict: {"served": served, "wrong": wrong}
                                    for verdict, (served, wrong) in self.semantic_by_verdict().items()},
            "windows": self.windows(window),
            "pool": self.pool,
            "wrong_hits": [{"index": i, "text": o.text, "label": o.label, "served_label": o.served_label,
                            "layer": o.layer, "similarity": o.similarity, "kind": o.wrong_kind,
                            "verdict": o.verdict}
                           for i, o in enumerate(self.outcomes) if o.wrong],
            # Every semantic hit's similarity, wrong (0/1) and rule: where a rule's wrong hits lie.
            "semantic_hits": [[o.similarity, int(o.wrong), o.verdict] for o in self.outcomes if o.layer == "semantic-hit"],
            # Every request's layer and rule, in order: two runs compared hit for hit (issue #45).
            "trace": [f"{o.layer}:{o.verdict or ''}:{o.served_label or ''}" for o in self.outcomes],
            # Every request's semantic decision (``replay run --simulate --decisions``): where reach is lost.
            "decisions": [o.decision for o in self.outcomes],
        }), indent=1)


def _content(body: Any) -> str | None:
    try:
        content = body["choices"][0]["message"]["content"]
        return content if isinstance(content, str) else None
    except (KeyError, IndexError, TypeError):
        return None


async def replay(stream: Sequence[Request], client: Poster, *, model: str, category: str,
                 after_each: Callable[[], Awaitable[None]] | None = None,
                 known_answers: dict[str, str] | None = None, feedback: float = 0.0, seed: int = 0,
                 decision_of: Callable[[], str] | None = None) -> Report:
    """Send the stream one request at a time and tally the outcomes.

    Args:
        stream: The requests.
        client: An HTTP client whose base URL is Strata.
        model: The model to name.
        category: The cache category to ask in (``X-Cache-Category``).
        after_each: Awaited after every request (a simulation lets observations settle, so
            that a replay gives the same counts every time).
        known_answers: Answers known before the first request (curated ones), and their labels.
        feedback: The share of wrong semantic hits the asker reports (``POST /v1/feedback``
            with ``verdict: wrong``), as users of a bot with a thumbs-down button would.
        seed: Seed of the draws of which wrong hits are reported.
        decision_of: Read after each response: that request's semantic decision (the simulation's traces).
    """
    report = Report()
    reporter = random.Random(seed)
    produced: dict[str, str] = dict(known_answers or {})  # answer text -> the label it answers
    served_wrongly: set[str] = set()  # questions served another label's answer so far
    headers = {"X-Cache-Category": category}
    for request in stream:
        body = {"model": model, "messages": [{"role": "user", "content": request.text}]}
        started = time.perf_counter()
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
        seconds = time.perf_counter() - started
        if response.status_code != 200:
            report.errors += 1
            continue
        layer = response.headers.get("x-cache", "miss")
        answered = response.json()
        content = _content(answered)
        served = produced.get(content) if layer.endswith("-hit") and content is not None else None
        similarity = response.headers.get("x-cache-similarity")
        outcome = Replayed(layer=layer, label=request.label, served_label=served, seconds=seconds,
                           text=request.text, similarity=float(similarity) if similarity else None,
                           verdict=response.headers.get("x-cache-verdict") or None,
                           decision=decision_of() if decision_of is not None else "")
        if outcome.wrong:
            outcome.wrong_kind = "repeat" if request.text in served_wrongly else \
                "twin" if request.label in produced.values() else "first_meeting"
            served_wrongly.add(request.text)
        if layer in ("miss", "bypass") and content is not None:
            produced.setdefault(content, request.label)
        report.outcomes.append(outcome)
        if after_each is not None:
            await after_each()  # write-backs and observations, so every run decides alike
        if report.outcomes[-1].wrong and layer == "semantic-hit" and feedback and reporter.random() < feedback:
            sent = await client.post("/v1/feedback", json={"id": answered.get("id"), "verdict": "wrong"}, headers={})
            report.feedback += sent.status_code == 200
    return report


def plot(report: Report, window: int, output: Path, title: str) -> None:
    """The learning curve: semantic and exact hit rates and the wrong share per window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.windows(window)
    x = [(i + 1) * window for i in range(len(rows))]
    figure, axis = plt.subplots(figsize=(7, 4.5), dpi=110)
    axis.plot(x, [100 * r["semantic"] for r in rows], marker="o", label="semantic hits, % of requests")
    axis.plot(x, [100 * r["exact"] for r in rows], marker="s", label="exact hits, % of requests")
    axis.plot(x, [100 * r["semantic_wrong"] for r in rows], marker="x", color="red",
              label="wrong semantic hits, % of semantic hits")
    axis.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="1%")
    axis.set(xlabel="requests so far (end of window)", ylabel="%", title=title, ylim=(0, 100))
    axis.legend(loc="upper left")
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output)
    plt.close(figure)
