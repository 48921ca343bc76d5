"""The verification stage: guards in both languages, the committed verifier, one decision path."""

from __future__ import annotations

import numpy as np
import pytest

from app.cache.decision.verify import (
    ABOVE_BAND,
    BELOW_THRESHOLD,
    ENTITIES_DIFFER,
    FEATURE_NAMES,
    NEGATION_DIFFERS,
    NEGATION_WORD_ONLY,
    NUMBERS_DIFFER,
    OPPOSITE_OPERATIONS,
    ORDER_DIFFERS,
    OWNER_DIFFERS,
    VALUES_DIFFER,
    VERIFIED,
    VERIFIER_REJECTED,
    Lexicon,
    PairAnalyzer,
    PairVerifier,
    VerifierArtifact,
)
from app.calibrate.fit import decide, tabulate
from app.calibrate.pairs import Pair
from app.policy import FixedSemantic
from app.settings import PROJECT_ROOT

LEXICON = PROJECT_ROOT / "schemas" / "verification.yaml"
ARTIFACT = PROJECT_ROOT / "schemas" / "verifier.json"
analyzer = PairAnalyzer(Lexicon.load(LEXICON))


@pytest.mark.parametrize(("asked", "cached", "reason"), [
    ("怎么退款", "怎么开发票", ENTITIES_DIFFER),
    ("花呗怎么还款", "借呗怎么还款", ENTITIES_DIFFER),
    ("How do I get a refund?", "How do I get an invoice?", ENTITIES_DIFFER),
    ("whats the exchange rate for us dollars to british pounds", "look up the conversion rate for the euro to dollar",
     ENTITIES_DIFFER),
    ("美元汇率是多少", "欧元汇率是多少", ENTITIES_DIFFER),
    ("退款100元多久到账", "退款200元多久到账", NUMBERS_DIFFER),
    ("订单12345在哪", "订单12346在哪", NUMBERS_DIFFER),
    ("分三期怎么还", "分6期怎么还", NUMBERS_DIFFER),
    ("Can I return it within 7 days?", "Can I return it within 30 days?", NUMBERS_DIFFER),
    ("花呗能用吗", "花呗不能用吗", NEGATION_DIFFERS),
    ("Why can I log in?", "Why can't I log in?", NEGATION_DIFFERS),
    ("怎么开通花呗", "怎么关闭花呗", OPPOSITE_OPERATIONS),
    ("怎么取消自动续费", "怎么恢复自动续费", OPPOSITE_OPERATIONS),
    ("How do I enable two-factor login?", "How do I disable two-factor login?", OPPOSITE_OPERATIONS),
    ("How do I increase my limit?", "How do I decrease my limit?", OPPOSITE_OPERATIONS),
    ("how can i unfreeze my bank account", "how do i freeze my bank account", OPPOSITE_OPERATIONS),
    ("please unblock my card", "please block my card", OPPOSITE_OPERATIONS),
    ("Can you tell me my name?", "Can you tell me your name?", OWNER_DIFFERS),  # CLINC150's user_name / what_is_your_name
    ("What's your phone number?", "What's my phone number?", OWNER_DIFFERS),
    ("我的地址在哪里", "你们的地址在哪里", OWNER_DIFFERS),
])
def test_guards_catch_mismatches_in_both_languages(asked: str, cached: str, reason: str) -> None:
    assert analyzer.signals(asked, cached).rejection == reason


@pytest.mark.parametrize(("asked", "cached"), [
    ("怎么退款", "退款怎么申请"),
    ("蚂蚁花呗怎么还款", "花呗如何还款"),  # names of one product are interchangeable
    ("余额宝怎么转出", "余额宝如何转出"),  # "余额宝" is not read as "余额"
    ("怎么申请退换货", "怎么退货"),  # "退换货" names the return process, not an exchange (换货) alone
    ("How do I reset my password?", "How can I reset my password?"),
    ("退款3天到账吗", "退款三天能到账吗"),  # 3 and 三 are the same number
    ("Can I open an account?", "Can I open a new account?"),
    ("What is your refund policy?", "What is the refund policy?"),  # one side names no owner
    ("Can you check my balance?", "Check my balance please"),  # "you" asks, it owns nothing
    ("What's your return policy for my order?", "What is the return policy for my order?"),
])
def test_guards_let_true_paraphrases_through(asked: str, cached: str) -> None:
    assert analyzer.signals(asked, cached).rejection is None


@pytest.mark.parametrize(("asked", "cached"), [
    ("收货地址能不能改", "收货地址可以修改吗"),  # a question asked both ways negates nothing
    ("有没有办法改地址", "怎么改收货地址"),
    ("是不是可以补开发票", "可以补开发票吗"),
    ("可以不可以退货", "可以退货吗"),
    ("退款到账了没有", "退款到账了吗"),  # 了没有 at the end asks; it does not say "not yet"
    ("退款是不是还没到", "退款怎么还没到"),  # the 没 left is a negation on both sides
    ("我想替别人充话费", "怎么给朋友充话费"),  # 别 of 别人 is "other"
    ("网速特别慢怎么办", "网速很慢怎么办"),
])
def test_chinese_questions_asked_both_ways_and_words_that_negate_nothing_pass_the_negation_guard(
        asked: str, cached: str) -> None:
    # What is left is a negation's word alone, which only the intent rule may serve past.
    assert analyzer.signals(asked, cached).rejections in ((), (NEGATION_WORD_ONLY,))


@pytest.mark.parametrize(("asked", "cached"), [
    ("退款还没有到账", "退款到账了吗"),
    ("不能退货吗", "可以退货吗"),
    ("能不能退款，我不想要了", "能不能退款"),  # the question asked both ways hides no other negation
    ("别点这个链接", "点这个链接"),
    ("退款没有到账", "退款到账了没有"),  # 没有 negates on one side, asks on the other
])
def test_a_chinese_negation_beside_a_question_asked_both_ways_still_counts(asked: str, cached: str) -> None:
    assert NEGATION_DIFFERS in analyzer.signals(asked, cached).rejections


def test_the_verifier_reads_the_negation_words_it_was_trained_on() -> None:
    # Its feature counts every negation word of the lexicon, as when schemas/verifier.json was
    # trained; only the guard reads a question asked both ways as no negation.
    negation = FEATURE_NAMES.index("negation_differs")
    assert analyzer.features("能不能退款", "怎么退款", 0.9)[negation] == 1.0
    assert analyzer.features("退款要多久", "怎么退款", 0.9)[negation] == 0.0
    assert analyzer.signals("能不能退款", "怎么退款").rejection == NEGATION_WORD_ONLY


def test_the_refund_question_never_gets_the_invoice_answer_even_when_cosine_says_so() -> None:
    verifier = PairVerifier.from_files(LEXICON, ARTIFACT)
    lenient = FixedSemantic(threshold=0.0, accept_above=0.0, min_probability=0.0)
    verdict = verifier.verify("怎么退款", "怎么开发票", 0.999, lenient)
    assert not verdict.accepted and verdict.reason == ENTITIES_DIFFER


def test_bands() -> None:
    verifier = PairVerifier.from_files(LEXICON, ARTIFACT)
    policy = FixedSemantic(threshold=0.8, accept_above=0.97, min_probability=0.5)
    assert verifier.verify("How do I reset my password?", "How can I reset my password?", 0.5, policy).reason == BELOW_THRESHOLD
    assert verifier.verify("How do I reset my password?", "How can I reset my password?", 0.98, policy).reason == ABOVE_BAND
    in_band = verifier.verify("How do I reset my password?", "How can I reset my password?", 0.9, policy)
    assert in_band.reason in (VERIFIED, VERIFIER_REJECTED)
    never = FixedSemantic(threshold=0.8, accept_above=1.0, min_probability=1.0)
    assert verifier.verify("How do I reset my password?", "How can I reset my password?", 0.9, never).reason == VERIFIER_REJECTED
    without_model = PairVerifier.from_files(LEXICON, None)
    assert not without_model.verify("How do I reset my password?", "How can I reset my password?", 0.9, policy).accepted


def test_the_committed_verifier_reproduces_its_training_decisions() -> None:
    artifact = VerifierArtifact.load(ARTIFACT)
    assert tuple(artifact.features) == FEATURE_NAMES and len(artifact.checks) >= 20
    assert {"afqmc_train", "qqp_hard_train"} <= set(artifact.trained_on["data"])
    assert "afqmc_dev" not in str(artifact.trained_on)  # never trained on the dev file
    rows = [analyzer.features(c["asked"], c["cached"], c["similarity"]) for c in artifact.checks]
    expected = np.array([c["probability"] for c in artifact.checks])
    assert np.allclose(artifact.model.probability(np.array(rows)), expected, atol=1e-9)
    assert np.allclose([artifact.model.probability_row(r) for r in rows], expected, atol=1e-9)


def test_the_vectorised_fit_decision_agrees_with_verify() -> None:
    verifier = PairVerifier.from_files(LEXICON, ARTIFACT)
    pairs = [("怎么退款", "退款怎么申请"), ("怎么退款", "怎么开发票"), ("How do I reset my password?", "How can I reset my password?"),
             ("What is the best laptop?", "What is a good laptop?"), ("花呗能用吗", "花呗不能用吗"),
             # Guards that are not among the verifier's features, and a question asked both ways.
             ("Can you tell me my name?", "Can you tell me your name?"), ("能不能退款", "退款怎么申请")]
    sims = np.array([0.91, 0.95, 0.93, 0.85, 0.97, 0.96, 0.92])
    table = tabulate([Pair(cached=c, asked=a, label=0) for a, c in pairs], sims, verifier)
    assert table.guard_ok.tolist() == [analyzer.signals(a, c).rejection is None for a, c in pairs]
    for policy in (FixedSemantic(threshold=0.8, accept_above=0.95, min_probability=0.5),
                   FixedSemantic(threshold=0.9, accept_above=1.0, min_probability=0.9)):
        one_by_one = [verifier.verify(a, c, s, policy).accepted for (a, c), s in zip(pairs, sims, strict=True)]
        assert decide(table, policy).tolist() == one_by_one


def test_bad_lexicons_and_artifacts_are_rejected(tmp_path) -> None:
    bad = tmp_path / "lexicon.yaml"
    bad.write_text("negations: [不]\n")
    with pytest.raises(ValueError, match="lexicon"):
        Lexicon.load(bad)
    broken = tmp_path / "verifier.json"
    broken.write_text('{"features": ["cosine"]}')
    with pytest.raises(ValueError, match="verifier artifact"):
        VerifierArtifact.load(broken)


# The same values in another order or role, in English and Chinese: each a different question.
SWAPPED = [
    ("Transfer 300 dollars from account 5 to account 9", "Transfer 300 dollars from account 9 to account 5"),
    ("Move 50 euros from savings to checking", "Move 50 euros from checking to savings"),
    ("Flights from Paris to Lyon on Friday", "Flights from Lyon to Paris on Friday"),
    ("train from paris to lyon", "train from lyon to paris"),
    ("Convert 5 usd to eur", "Convert 5 eur to usd"),
    ("What is 10 divided by 2?", "What is 2 divided by 10?"),
    ("Is 5 bigger than 9?", "Is 9 bigger than 5?"),
    ("What is 7 minus 3?", "What is 3 minus 7?"),
    ("Pay invoice 12 before invoice 15", "Pay invoice 15 before invoice 12"),
    ("从5号账户转300元到9号账户", "从9号账户转300元到5号账户"),
    ("从北京到上海的高铁几点", "从上海到北京的高铁几点"),
    ("从余额宝转到银行卡要多久", "从银行卡转到余额宝要多久"),
    ("10除以2等于多少", "2除以10等于多少"),
    ("3比5大吗", "5比3大吗"),
    ("把100美元换成人民币", "把100人民币换成美元"),
    ("向9号账户转账5元", "向5号账户转账9元"),
    ("第3期和第5期账单", "第5期和第3期账单"),
]
# Values that differ in a way the number guard alone missed: ids, dates, weekdays, e-mail, names.
DIFFERENT_VALUES = [
    ("Where is order ab12cd?", "Where is order ab12ce?"),
    ("c3 n9", "c9 n3"),  # the load test's swapped digits
    ("Can I book for Monday?", "Can I book for Tuesday?"),
    ("Send the receipt to alice@example.com", "Send the receipt to bob@example.com"),
    ("What's the weather in Lyon?", "What's the weather in Paris?"),
    ("周一能办理吗", "周二能办理吗"),
    ("Is the branch open today?", "Is the branch open tomorrow?"),
]


@pytest.mark.parametrize(("asked", "cached"), SWAPPED)
def test_the_same_values_in_another_order_or_role_are_rejected(asked: str, cached: str) -> None:
    assert analyzer.signals(asked, cached).rejection == ORDER_DIFFERS
    assert analyzer.signals(cached, asked).rejection == ORDER_DIFFERS


@pytest.mark.parametrize(("asked", "cached"), DIFFERENT_VALUES)
def test_different_ids_dates_addresses_and_names_are_rejected(asked: str, cached: str) -> None:
    assert analyzer.signals(asked, cached).rejection == VALUES_DIFFER


@pytest.mark.parametrize(("asked", "cached"), [
    ("Transfer 300 dollars from account 5 to account 9", "Move 300 dollars to account 9 from account 5"),
    ("从5号账户转300元到9号账户", "转300元，从5号账户到9号账户"),
    ("How do I send money to a friend?", "How can I transfer money to someone?"),
    ("转账5000元多久到账", "5000元转账要多久才能到账"),
    ("How do I move money into my savings account?", "How do I transfer money to my savings account?"),
    ("What's the weather in Lyon?", "what is the weather like in Lyon"),
])
def test_order_guards_let_reworded_questions_with_the_same_roles_through(asked: str, cached: str) -> None:
    assert analyzer.signals(asked, cached).rejection is None


def test_the_order_guard_rejects_in_every_band_including_above_it() -> None:
    verifier = PairVerifier(analyzer, None)
    strict = FixedSemantic(threshold=0.98, accept_above=0.99, min_probability=0.99)
    for asked, cached in SWAPPED[:1] + SWAPPED[10:11]:
        verdict = verifier.verify(asked, cached, 0.995, strict)
        assert not verdict.accepted and verdict.reason == ORDER_DIFFERS
