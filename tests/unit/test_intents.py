"""A team's intents (issue #46): the file's checks, the head and its calibration's guarantee."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.cache.learning.intents import (
    Fold,
    SoftmaxHead,
    binomial_tail,
    calibrate,
    domain_floor,
    fewest_to_show,
    held_out_folds,
    rule_outcomes,
    shared_chance_floor,
    stand_in_reach,
)
from app.cache.storage.intents import HeadMeta, IntentHead
from app.intents import IntentsFileError, probation_words, read_intents


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_file_is_checked_whole_with_a_clear_message(tmp_path: Path) -> None:
    good = write(tmp_path, "good.csv", "\ufefftext,intent\nhow do i return,returns\nsend it back,returns\n"
                                       "where is my parcel,tracking\ntrack my order,tracking\n")
    assert [(i.intent, len(i.phrasings)) for i in read_intents(good)] == [("returns", 2), ("tracking", 2)]
    yaml_file = write(tmp_path, "team.yaml", "- {intent: refund, phrasings: [怎么退款, 退款怎么申请], answer: 在订单页申请。}\n"
                                             "- {intent: table, phrasings: [book a table, reserve a table], shared: false}\n")
    refund, table = read_intents(yaml_file)
    assert refund.answer == "在订单页申请。" and not table.shared
    for name, text, said in [
        ("one.csv", "text,intent\nhow do i return,returns\nwhere is it,tracking\nwhere is my parcel,tracking\n",
         "needs at least two different phrasings"),
        ("twice.csv", "text,intent\nhello,a\nhi,a\nhello,b\nhey,b\n", "is a phrasing of both"),
        ("empty.csv", "text,intent\n ,a\nhi,a\n", "an empty phrasing"),
        ("header.csv", "question,label\nhi,a\n", "the header must name text and intent"),
        ("bad.yaml", "- {intent: a, phrasings: [x, y], colour: red}\n", "colour"),
    ]:
        with pytest.raises(IntentsFileError, match=said):
            read_intents(write(tmp_path, name, text))


def clusters(per: int, classes: int, noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, 32))
    labels = np.repeat(np.arange(classes), per)
    vectors = centres[labels] + noise * rng.normal(size=(len(labels), 32))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32), labels


def test_the_head_learns_separable_intents_and_stores_as_plain_arrays() -> None:
    vectors, labels = clusters(40, 6, 0.3)
    fitted = SoftmaxHead(n_classes=6).fit(vectors, labels)
    assert fitted.get_params()["n_classes"] == 6 and list(fitted.classes_) == list(range(6))
    assert np.allclose(fitted.predict_proba(vectors).sum(axis=1), 1.0) and (fitted.predict(vectors) == labels).mean() > 0.98
    weights, bias = fitted.coef_, fitted.intercept_
    predicted, confidence = fitted.read(vectors)
    assert (predicted == labels).mean() > 0.98 and confidence.min() > 0.2
    meta = HeadMeta(name="t", tenant="acme", category="faq", intents=[f"i{n}" for n in range(6)], shared=[True] * 6,
                    threshold=0.5, fingerprint="use:32", phrasings=240, accuracy=1.0, served_share=1.0,
                    held_out_wrong=0.0, error_bound=0.01, rule="", loaded_at=0)
    head = IntentHead.from_hash({k.encode(): v for k, v in IntentHead(meta, weights, bias).to_hash().items()})
    assert head.guess(vectors[0]).intent == "i0" and np.allclose(head.weights, weights)


def test_learn_then_test_refuses_what_it_cannot_show_and_certifies_what_it_can() -> None:
    assert fewest_to_show(0.01) == 299 and binomial_tail(0, 299, 0.01) < 0.05 < binomial_tail(0, 298, 0.01)
    # Too few phrasings to show 1% at 95%: the rule serves nothing.
    few, few_labels = clusters(5, 10, 0.2)
    assert calibrate(few, few_labels, 10, 0.01, 0.0).threshold > 1
    # Well separated and plentiful: a threshold, and the held-out wrong share within the bound.
    many, labels = clusters(150, 10, 0.2, seed=1)
    shown = calibrate(many, labels, 10, 0.05, 0.0, delta=0.05)
    assert shown.threshold <= 1 and shown.held_out_wrong <= 0.05 and shown.served_share > 0.3
    # Overlapping intents: wrong at every confidence, nothing certified.
    blur, blur_labels = clusters(150, 10, 3.0, seed=2)
    assert calibrate(blur, blur_labels, 10, 0.01, 0.0).threshold > 1


def test_two_sequences_share_the_risk_and_the_guards_are_replayed() -> None:
    # Two fixed sequences at half the risk each: a clean record needs 368 hits at 1%, 95%.
    assert fewest_to_show(0.01, 0.05, 2) == 368 and fewest_to_show(0.01, 0.05, 2) > fewest_to_show(0.01)
    many, labels = clusters(150, 10, 0.2, seed=1)
    assert calibrate(many, labels, 10, 0.05, 0.0, delta=0.05).threshold <= 1
    # Guards that set every cached phrasing aside leave the rule nothing to serve in the folds.
    assert calibrate(many, labels, 10, 0.05, 0.0, delta=0.05, refused=lambda asker, cached: True).threshold > 1
    # Set aside by guards the intent rule overrules for the asker's reading (the negation guard
    # within intents the team's phrasings negate): the replay keeps those pairs, for those readings.
    assert calibrate(many, labels, 10, 0.05, 0.0, delta=0.05, refused=lambda asker, cached: True,
                     overrulable=lambda asker, cached, intent: True).threshold <= 1
    assert calibrate(many, labels, 10, 0.05, 0.0, delta=0.05, refused=lambda asker, cached: True,
                     overrulable=lambda asker, cached, intent: False).threshold > 1
    # The replay asks with the asker's reading, as the rule asks with the head's guess.
    read_as: list[int] = []

    def noting(asker: int, cached: int, intent: int) -> bool:
        read_as.append(intent)
        return False

    calibrate(many, labels, 10, 0.05, 0.0, delta=0.05, refused=lambda asker, cached: True, overrulable=noting)
    assert read_as and set(read_as) <= set(range(10))


def test_an_intent_whose_own_phrasings_differ_in_negation_is_found_from_the_file() -> None:
    from app.cache.decision.verify import load_verifier
    from app.intents import IntentDef, negation_within
    from app.settings import Settings

    verifier = load_verifier(Settings())
    items = [IntentDef(intent="data_plan", phrasings=["怎么加流量包", "流量不够用怎么办", "流量包怎么订购"]),
             IntentDef(intent="check_bill", phrasings=["怎么查话费账单", "账单在哪里看"]),
             IntentDef(intent="card_declined", phrasings=["my card was declined", "my card does not work"]),
             IntentDef(intent="table", phrasings=["book a table", "i do not want to book a table"], shared=False),
             IntentDef(intent="out_of_scope", phrasings=["今天天气怎么样", "你们不下班吗"])]
    assert negation_within(items, verifier.guards, english=False) == [True, False, True, False, False]
    # An English file keeps the negation guard for every intent.
    assert negation_within(items, verifier.guards, english=True) == [False] * 5


def test_the_folds_find_neighbours_with_the_index_vectors_when_the_head_reads_another_embedder() -> None:
    many, labels = clusters(150, 10, 0.2, seed=1)
    # The head reads `many`; the index's vectors put no two phrasings in the band (orthogonal
    # rows): the folds' band is empty, and only the rows read as the asker's intent remain.
    apart = np.eye(len(labels), 64 * 32, dtype=np.float32)[:, : len(labels)]
    folds = held_out_folds(many, labels, 10, 0.5, near=apart)
    assert all((f.neighbours < 0).all() for f in folds)
    assert all((f.of_intent >= 0).any(axis=1).all() for f in folds)
    # Beyond the band only from the floor's similarity on (the index's): orthogonal rows are at 0.
    assert all((f.of_intent < 0).all() for f in held_out_folds(many, labels, 10, 0.5, near=apart, beyond_floor=0.45))
    # The same index vectors as the head's: the band is found, and the threshold is what it was.
    alone = calibrate(many, labels, 10, 0.05, 0.5, delta=0.05)
    assert calibrate(many, labels, 10, 0.05, 0.5, delta=0.05, near=many).threshold == alone.threshold


def test_the_intent_rule_looks_beyond_the_band_only_at_rows_read_as_the_asked_intent() -> None:
    # Three askers: 0 and 1 of intent 0, 2 of intent 1 (unknown to the head).
    fold = Fold(labels=np.array([0, 0, 1]), predicted=np.array([0, 0, 0]), confidence=np.array([0.99, 0.99, 0.99]),
                unknown=np.array([False, False, True]), neighbours=np.full((3, 8), -1),
                of_intent=np.array([[1, -1, -1, -1], [0, 2, -1, -1], [0, 1, -1, -1]]))
    served, wrong = rule_outcomes(fold, 0.95, beyond_band=True)
    assert served.tolist() == [True, True, True] and wrong.tolist() == [False, False, True]
    # Below the threshold the rows of the intent serve nothing; nor do they for a rule kept to the band.
    assert not rule_outcomes(fold, 0.999, beyond_band=True)[0].any()
    assert not rule_outcomes(fold, 0.95)[0].any()


def test_an_intent_whose_hits_were_wrong_is_set_aside_alone_and_a_broken_calibration_stops_the_tenant() -> None:
    from app.cache.decision.rules import SET_ASIDE_MOST, intents_refuted
    from app.cache.decision.stats import PooledCounts
    from app.policy import AdaptiveSemantic

    policy = AdaptiveSemantic(threshold=0.6, error_bound=0.01, confidence=0.85)

    def watch(wrong_of: dict[str, int], right: int) -> object:
        fields = {"intent_ok:090": right, "intent_wrong:090": sum(wrong_of.values()), "ok:090": 7}
        fields.update({f"intent_wrong_of:{intent}": n for intent, n in wrong_of.items()})
        fields["intent_ok_of:card_lost"] = right
        return intents_refuted(PooledCounts(fields), policy)

    clean = watch({}, 40)
    assert clean.serves("card_lost") and not clean.set_aside and (clean.wrong, clean.total) == (0, 40)
    # One intent's wrong hit (a label error) refutes that intent only: the others' 40 clean hits serve.
    one = watch({"exchange_rate": 1}, 40)
    assert one.set_aside == ("exchange_rate",) and not one.suspended
    assert not one.serves("exchange_rate") and one.serves("card_lost")
    # Wrong hits spread over more intents than may be set aside: what is left still refutes, and
    # the rule stops for the tenant (a broken calibration is not hidden one intent at a time).
    spread = watch({f"intent_{i}": 1 for i in range(SET_ASIDE_MOST + 2)}, 40)
    assert len(spread.set_aside) == SET_ASIDE_MOST and spread.suspended and not spread.serves("card_lost")
    # The same record without the per-intent fields (measured before they existed): the tenant's alone.
    assert intents_refuted(PooledCounts({"intent_ok:090": 4, "intent_wrong:090": 1}), policy).suspended


def test_a_small_file_is_its_own_cache_and_certifies_where_one_fold_of_it_could_not() -> None:
    from app.cache.learning.intents import SMALL_FILE_FOLDS, folds_for

    # 10 phrasings of each of 40 intents: cut in 10 folds, every phrasing read by a head that
    # never saw it, and its neighbours found in the whole file (a fold holds one of each intent).
    vectors, labels = clusters(10, 40, 0.2, seed=3)
    assert folds_for(len(labels)) == SMALL_FILE_FOLDS
    (stream,) = held_out_folds(vectors, labels, 40, 0.0)
    assert len(stream.labels) == len(labels) and (stream.neighbours[:, 0] >= 0).all()
    assert (labels[stream.neighbours[:, 0]] == labels).mean() > 0.95  # a phrasing's nearest is of its intent
    # The rule is shown within the bound and serves most of the held-out phrasings.
    shown = calibrate(vectors, labels, 40, 0.05, 0.0, delta=0.05)
    assert shown.threshold <= 1 and shown.served_share > 0.5 and shown.held_out_wrong <= 0.05


def test_probation_starts_where_the_files_held_out_phrasings_are_wrong_no_more_often_than_the_bound() -> None:
    """Issue #62 item 1: a small file certifies nothing; the rule serves on probation from the
    lowest confidence down to which its held-out replay stays within the bound (read once a level
    serves 1 / bound phrasings), not down to where it is sure to be over it."""
    vectors, labels = clusters(6, 30, 0.8, seed=5)  # twins: a small file's head mixes some up
    bound = 0.01
    shown = calibrate(vectors, labels, 30, bound, 0.0)
    assert shown.threshold > 1 and shown.probation <= 1, shown
    assert shown.probation_wrong <= bound and shown.probation_served > 0
    (fold,) = held_out_folds(vectors, labels, 30, 0.0)
    served, wrong = rule_outcomes(fold, shown.probation)
    assert wrong.sum() <= bound * served.sum()
    # Lower down it is wrong more often than the bound: the walk stopped for it.
    served, wrong = rule_outcomes(fold, 0.5)
    assert wrong.sum() > bound * served.sum()


def test_the_load_says_where_probation_starts_and_why() -> None:
    """Within the rule's bound on the file's held-out phrasings, or a file too small to tell."""
    from app.cache.learning.intents import Calibration
    from app.policy import AdaptiveSemantic

    policy = AdaptiveSemantic(error_bound=0.01)  # the rule's bound: three quarters of it
    said = {wrong: probation_words(Calibration(threshold=1.01, accuracy=0.9, served_share=0.0, held_out_wrong=0.0,
                                               held_out=100, unknown_served=0, probation=0.886,
                                               probation_served=0.6, probation_wrong=wrong), 0.886, policy, 0.05)
            for wrong in (0.0059, 0.0244)}
    assert "confidence >= 0.886, the lowest confidence its held-out phrasings were wrong no more often" in said[0.0059]
    assert "as low as a file this small was not shown over the rule's bound" in said[0.0244]
    assert "2.44% of them wrong" in said[0.0244]


def test_a_file_that_serves_nothing_is_told_why_in_numbers_it_can_act_on() -> None:
    """The support lead's 8 x 6 file (issue #56 item 4): how many phrasings would do, or what
    bound this file can show."""
    from app.cache.learning.intents import best_bound_shown, fewest_to_show, why_it_serves_nothing

    said = why_it_serves_nothing(intents=8, phrasings=48, bound=0.01, delta=0.05)
    assert "368 times" in said and "46 phrasings per intent" in said and "320 more" in said, said
    assert "7.4% wrong" in said and "error_bound of 7.4%" in said, said
    # The intent rule held to three quarters of the category's bound: the category's bound it would take.
    held = why_it_serves_nothing(intents=8, phrasings=48, bound=0.0075, delta=0.05, share=0.75)
    assert "at most 0.75% wrong" in held and "491 times" in held and "error_bound of 9.9%" in held, held
    # The bound shown is the inverse of the count needed.
    assert fewest_to_show(best_bound_shown(368, 0.05, 2), 0.05, 2) <= 368


def test_a_command_writing_a_file_makes_its_folder(tmp_path: Path) -> None:
    """``strata replay intents --out`` into a folder that does not exist yet (issue #56 item 7)."""
    from app.cli import main
    from app.settings import PROJECT_ROOT

    data = PROJECT_ROOT.parent / "shared" / "data"
    if not (data / "clinc150.csv").exists():
        pytest.skip("../shared/data/clinc150.csv is not here")
    out = tmp_path / "not" / "yet" / "intents.yaml"
    assert main(["replay", "intents", "--source", "clinc", "--data-dir", str(data), "--intents", "3", "--out", str(out)]) == 0
    assert out.exists()


def test_a_teams_own_out_of_scope_questions_stand_for_the_unknown_and_are_never_served(tmp_path: Path) -> None:
    """Issue #58 item 5: a file's out_of_scope phrasings are the calibration's unknown questions
    (no intent is held out for them), wrong whenever served, and never served themselves."""
    from app.intents import out_of_scope_name

    assert out_of_scope_name("out_of_scope") and out_of_scope_name("Default Fallback Intent") and out_of_scope_name("OOS")
    assert not out_of_scope_name("refund")
    many, labels = clusters(150, 11, 0.2, seed=1)  # intent 10 plays the team's out-of-scope questions
    scoped = np.arange(11) == 10
    folds = held_out_folds(many, labels, 11, 0.0, out_of_scope=scoped, servable=~scoped)
    assert (folds[0].unknown == (labels == 10)).all()  # exactly its own, no intent held out
    served, wrong = rule_outcomes(folds[0], 0.0)
    assert not served[folds[0].predicted == 10].any()  # read as out of scope: never served
    assert wrong[served & (labels == 10)].all()  # an out-of-scope question served is always wrong
    # Without them a tenth of the intents is held out instead.
    assert held_out_folds(many, labels, 11, 0.0)[0].unknown.sum() == 150
    # In a file: the name marks it, and it takes no answer.
    path = tmp_path / "team.yaml"
    path.write_text("- {intent: refund, phrasings: [i want my money back, refund please]}\n"
                    "- {intent: out_of_scope, phrasings: [whats the weather, tell me a joke]}\n")
    items = read_intents(path)
    assert [i.out_of_scope for i in items] == [False, True]
    path.write_text("- {intent: oos, phrasings: [whats the weather, tell me a joke], answer: sorry}\n")
    with pytest.raises(IntentsFileError, match="out of scope"):
        read_intents(path)


def test_the_load_measures_the_vetos_floor_and_how_far_out_of_scope_questions_reach() -> None:
    """Issue #62 items 3 and 4: the veto's floor on two questions' chance of one intent costs at
    most about a hundredth of the file's own neighbours of one intent, and sets aside more of its
    neighbours of two; the out-of-scope stand-ins' highest reading as a servable intent is kept."""
    vectors, labels = clusters(60, 11, 0.9, seed=3)  # overlapping: a diffuse head, like a small file's
    scoped = np.arange(11) == 10
    # Out-of-scope questions are about anything: no cluster of their own.
    scattered = np.random.default_rng(4).normal(size=(60, 32))
    vectors[labels == 10] = scattered / np.linalg.norm(scattered, axis=1, keepdims=True)
    fold = held_out_folds(vectors, labels, 11, 0.0, out_of_scope=scoped, servable=~scoped)[0]
    assert fold.probabilities is not None and np.allclose(fold.probabilities.sum(axis=1), 1.0, atol=1e-4)
    assert (fold.probabilities.argmax(axis=1) == fold.predicted).all()
    floor, same, other = shared_chance_floor(fold)
    assert 0.0 < floor <= 0.2 and same <= 0.02 and other > same
    reach = stand_in_reach(fold, 11)
    out = fold.unknown & ~scoped[fold.predicted]
    assert out.any() and max(reach) == fold.confidence[out].max() and reach[10] == 0.0
    # Per intent: each intent's reach is what the stand-ins read as it reached, 0 where none was.
    for intent in range(10):
        mine = out & (fold.predicted == intent)
        assert reach[intent] == (fold.confidence[mine].max() if mine.any() else 0.0)
    # Read as their own out-of-scope class only: nothing reaches an intent.
    certain = Fold(labels=np.array([0, 1]), predicted=np.array([0, 1]), confidence=np.array([0.9, 0.99]),
                   unknown=np.array([False, True]), neighbours=np.full((2, 8), -1), of_intent=np.full((2, 4), -1),
                   servable=np.array([True, False]))
    assert stand_in_reach(certain, 2) == [0.0, 0.0]
    # Too few pairs of one intent to place a floor: none.
    assert shared_chance_floor(certain) == (0.0, 0.0, 0.0)
    shown = calibrate(vectors, labels, 11, 0.05, 0.0, out_of_scope=scoped, servable=~scoped)
    assert (shown.veto_below, shown.stand_in_reach) == (floor, reach)
    # The domain gate: 1% of the team's own held-out phrasings read more weakly than its floor.
    assert fold.energy is not None and shown.domain_floor == domain_floor(fold)
    assert shown.domain_floor is not None
    below = fold.energy[~fold.unknown] < shown.domain_floor
    assert 0 < below.sum() <= 0.01 * below.size + 1
    assert domain_floor(certain) is None  # no energies kept
