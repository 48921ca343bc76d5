"""Where an adaptive category's refused candidates are, and how many of them were right.

    python -m bench.refusals --stream .run/replay/bank3000-s0.jsonl --policy .run/replay/var.yaml [--category faq]

Replays a stream as ``strata replay run --simulate`` does (an own Redis Stack, the labelled
upstream, the service's embedder) and records every verdict of the adaptive decision on a
candidate the guards let through, with the entry record it read. Joined with the stream's
labels, each verdict falls in one bucket:

- served: ``above_band``, ``within_bound``, ``entry_record``;
- refused by ``wrong_before`` (the document was wrong at this similarity or above);
- refused by ``outside_bound``, split by why the entry record did not vouch either: the score
  below ``entry_floor``, another answer within ``entry_margin``, fewer than
  ``entry_confirmations`` confirmations at lower scores (0-2 or 3-4 when the policy asks for 5),
  or the entry's wrong similarity at the candidate's or above it, or within the wrong gap
  below it.

For each bucket it prints how many candidates had the asker's answer (right) and how many did
not. A bucket whose wrong share is well above the category's bound is reach no rule on these
figures can take without breaking the bound; a clean one is where to look. The decision's
private method is wrapped for the replay only (a measurement, never the service's code path).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

import app.cache.decision.adaptive as adaptive
import app.cache.decision.rules as rules
import app.cache.decision.stats as stats
from app.cache.decision.verify import OUTSIDE_BOUND
from app.cache.storage.keys import FIELD_QUESTION, as_text, normalize_text
from app.policy import AdaptiveSemantic, Policy, SemanticPolicy
from app.replay.simulate import run_simulated
from app.replay.streams import read_stream
from app.settings import Settings


class Logged(msgspec.Struct, frozen=True, kw_only=True):
    """One verdict of a replay, joined with the labels."""

    right: bool
    served: bool
    reason: str
    similarity: float
    score: float
    confirmations: int | None
    wrong_above: int | None


def bucket(verdict: Logged, policy: SemanticPolicy) -> str:
    """The bucket of one verdict (see the module's docstring)."""
    if verdict.served:
        return f"served {verdict.reason}"
    if verdict.reason != OUTSIDE_BOUND:
        return f"refused {verdict.reason}"
    if verdict.score < policy.entry_floor:
        return f"refused: score below entry_floor {policy.entry_floor}"
    if (verdict.score - verdict.similarity) / stats.MARGIN_WEIGHT < policy.entry_margin:
        return f"refused: another answer within entry_margin {policy.entry_margin}"
    confirmations = verdict.confirmations or 0
    if confirmations < policy.entry_confirmations:
        few = max(1, policy.entry_confirmations - 2)
        band = f"0-{few - 1}" if confirmations < few else f"{few}-{policy.entry_confirmations - 1}"
        return f"refused: {band} confirmations below the score"
    wrong_above = verdict.wrong_above if verdict.wrong_above is not None else -1
    if stats.milli(verdict.similarity) <= wrong_above:
        return "refused: entry wrong at this similarity or above"
    return f"refused: entry wrong within {stats.ENTRY_WRONG_GAP} below"


def record(stream: Sequence[Any], settings: Settings, category: str) -> list[Logged]:
    """Replay ``stream`` (simulated) and return every verdict with the labels' judgement."""
    label_of = {normalize_text(request.text): request.label for request in stream}
    logged: list[Logged] = []
    read: dict[str, int] = {}
    decide_rule = adaptive.AdaptiveDecision._rule
    vouches = rules.entry_vouches

    def reading_vouches(values: Sequence[bytes | str | None], similarity: float, policy: AdaptiveSemantic) -> bool:
        read["confirmations"] = sum(int(value or 0) for value in values[1:])
        read["wrong_above"] = int(values[0] or -1)
        return vouches(values, similarity, policy)

    async def logging_rule(self: adaptive.AdaptiveDecision, facts: rules.Facts) -> rules.Ruling:
        read.clear()
        ruling = await decide_rule(self, facts)
        if ruling.next_row:
            return ruling  # a guard: not a verdict on a candidate the guards let through
        cached = as_text(facts.row.fields[FIELD_QUESTION]) or ""
        logged.append(Logged(
            right=label_of.get(normalize_text(facts.question)) == label_of.get(normalize_text(cached)),
            served=ruling.verdict.accepted, reason=ruling.verdict.reason, similarity=facts.similarity,
            score=facts.score, confirmations=read.get("confirmations"), wrong_above=read.get("wrong_above")))
        return ruling

    rules.entry_vouches = reading_vouches
    adaptive.AdaptiveDecision._rule = logging_rule  # type: ignore[method-assign]
    try:
        run_simulated(list(stream), settings=settings, category=category)
    finally:
        rules.entry_vouches = vouches
        adaptive.AdaptiveDecision._rule = decide_rule  # type: ignore[method-assign]
    return logged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", required=True, help="a replay stream (strata replay build)")
    parser.add_argument("--policy", required=True, help="the policy file to replay under")
    parser.add_argument("--category", default="faq", help="an adaptive category of the policy")
    args = parser.parse_args(argv)
    settings = msgspec.structs.replace(Settings.from_env(), policy_file=str(Path(args.policy).resolve()))
    category = Policy.load(settings.resolve(settings.policy_file)).categories.get(args.category)
    if category is None or category.semantic.error_bound is None:
        print(f"{args.category!r} is not an adaptive category of {args.policy}", file=sys.stderr)
        return 2
    logged = record(read_stream(Path(args.stream)), settings, args.category)
    counts: Counter[tuple[str, bool]] = Counter((bucket(v, category.semantic), v.right) for v in logged)
    print(f"{args.stream}: {len(logged)} verdicts on candidates the guards let through")
    print(f"{'bucket':<58} {'right':>6} {'wrong':>6} {'wrong share':>11}")
    for name in sorted({name for name, _ in counts}):
        right, wrong = counts[(name, True)], counts[(name, False)]
        print(f"{name:<58} {right:>6} {wrong:>6} {wrong / (right + wrong):>10.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
