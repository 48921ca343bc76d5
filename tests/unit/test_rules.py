"""The adaptive decision's rules (issue #45): built from a category's policy in one place, in
the order docs/SEMANTIC.md shows, each with the reasons it may give."""

from __future__ import annotations

from app.cache.decision.rules import (
    RULE_ORDER,
    CuratedWording,
    DocumentVeto,
    EntryRecord,
    Guards,
    IntentMatch,
    IntentVeto,
    OutsideBound,
    Pool,
    ReaderRule,
    rule_table,
    rules_for,
)
from app.cache.decision.verify import CandidateCheck, ThresholdVerifier
from app.cache.readers.oracle import OracleReader
from app.policy import AdaptiveSemantic
from app.settings import PROJECT_ROOT


def kinds(policy: AdaptiveSemantic, reader: object = None) -> list[type]:
    return [type(rule) for rule in rules_for(policy, CandidateCheck(ThresholdVerifier()), None, reader,  # type: ignore[arg-type]
                                             lambda name, verdict: None)]


def test_a_categorys_rules_come_from_its_policy_in_one_order() -> None:
    bare = AdaptiveSemantic(error_bound=0.01)
    assert kinds(bare) == [Guards, DocumentVeto, CuratedWording, IntentVeto, IntentMatch, Pool, OutsideBound]
    recorded = AdaptiveSemantic(error_bound=0.01, entry_confirmations=5, reader="serve")
    assert kinds(recorded, OracleReader({})) == [Guards, DocumentVeto, CuratedWording, IntentVeto, IntentMatch, Pool, EntryRecord,
                                                 ReaderRule, OutsideBound]
    # A reader configured but off in the policy is not in the list.
    assert ReaderRule not in kinds(AdaptiveSemantic(error_bound=0.01, reader="off"), OracleReader({}))


def test_docs_semantic_shows_the_rule_table_of_the_code() -> None:
    table = rule_table()
    assert table.count("\n") == len(RULE_ORDER) + 1
    assert table in (PROJECT_ROOT / "docs" / "SEMANTIC.md").read_text(encoding="utf-8")
