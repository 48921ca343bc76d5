"""The arithmetic of issue #46's head-limits bench: the most a confidence serves at the bound."""

from __future__ import annotations

import numpy as np

from bench.head_limits import most_served


def test_most_served_takes_the_longest_prefix_by_confidence_within_the_bound() -> None:
    score = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    misread = np.array([False, False, True, False, True])
    unknown = np.zeros(5, dtype=bool)
    everyone = np.ones(5, dtype=bool)
    # By confidence: right, right, wrong (1 of 3), right (1 of 4), wrong (2 of 5).
    assert most_served(score, misread, unknown, everyone, bound=0.25) == 4 / 5
    assert most_served(score, misread, unknown, everyone, bound=0.2) == 2 / 5
    assert most_served(score, misread, unknown, everyone, bound=0.4) == 1.0


def test_an_unknown_intent_served_is_wrong_and_a_gate_shares_of_all_phrasings() -> None:
    score = np.array([0.9, 0.8, 0.7, 0.6])
    misread = np.zeros(4, dtype=bool)
    unknown = np.array([True, False, False, False])
    assert most_served(score, misread, unknown, np.ones(4, dtype=bool), bound=0.0) == 0.0
    # The gate sets the unknown phrasing aside; the share stays of all four phrasings.
    gate = np.array([False, True, True, True])
    assert most_served(score, misread, unknown, gate, bound=0.0) == 3 / 4


def test_first_askings_skip_word_for_word_repeats_and_count_what_a_perfect_cache_serves() -> None:
    from bench.intent_embedders import first_askings

    asked = ["how do i pay", "how do i pay", "paying how", "lost card", "oos one", "oos two"]
    truth = ["pay", "pay", "pay", "lost", "oos:oos one", "oos:oos two"]
    order, perfect = first_askings(asked, truth)
    assert order.tolist() == [0, 2, 3, 4, 5]
    assert perfect == 1  # "paying how": its label asked before; out-of-scope questions never count


def test_two_intent_shares_count_each_pair_once_and_the_mixed_ones() -> None:
    from bench.head_limits import two_intent_shares

    # Two phrasings of intent 0 close together, one of intent 1 close to the first, one far away.
    vectors = np.array([[1.0, 0.0], [0.99, 0.141], [0.95, -0.312], [0.0, 1.0]])
    labels = np.array([0, 0, 1, 2])
    (near, near_mixed), (close, close_mixed), (everything, all_mixed) = two_intent_shares(
        vectors, labels, (0.98, 0.89, -1.0), block=3)
    assert (near, near_mixed) == (1, 0.0)                     # only the two of intent 0
    assert close == 3 and abs(close_mixed - 2 / 3) < 1e-9     # and intent 1's phrasing with each of them
    assert everything == 6 and abs(all_mixed - 5 / 6) < 1e-9  # 4 phrasings, 6 pairs, 1 of one intent


def test_the_rule_on_a_stream_serves_its_intents_nearest_and_stops_serving_an_entry_its_check_refuted() -> None:
    from bench.head_limits import rule_on_stream

    # Questions 0-1 are one intent (read 0); 2 is mislabelled (read 0, labelled b); 3-5 ask intent a;
    # 6 is out of scope, read 0 too. Vectors: 0 and 3 close; 2 close to 4 and 5; 1 and 6 far from all.
    asked = ["q0", "q1", "q2", "q3", "q4", "q5", "q6"]
    truth = ["a", "a", "b", "a", "a", "a", "oos:q6"]
    near = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.99, 0.141, 0.0],
                     [0.141, 0.99, 0.0], [0.1, 0.995, 0.0], [-0.6, -0.8, 0.0]])
    read = np.zeros(7, dtype=int)
    sure = np.full(7, 0.99)
    never: dict[tuple[int, int], bool] = {}
    # The band: q1 and q6 have nothing at the floor; q3 is served q0 (right); q4 is served q2 (wrong,
    # and its check refutes q2); q5 then skips q2 and is served q3 (right).
    served, wrong, perfect = rule_on_stream(asked, truth, near, read, sure, 0.9, False, lambda a, b: False, never)
    assert (served, wrong, perfect) == (3, 1, 4)
    # Anywhere, every asker after the first is served: q1 from q0 (right); q2 from q0 (wrong: its
    # label is b; q0's check refutes it); q3 from q2, its nearest left (wrong, q2 refuted); q4 and q5
    # from q3 (right); q6 (out of scope), always wrong.
    served, wrong, _ = rule_on_stream(asked, truth, near, read, sure, 0.9, True, lambda a, b: False, {})
    assert (served, wrong) == (6, 3)
    # Below the threshold nothing is served; a refused pair is passed over.
    assert rule_on_stream(asked, truth, near, read, np.full(7, 0.5), 0.9, True, lambda a, b: False, {})[:2] == (0, 0)
    refusing = rule_on_stream(asked, truth, near, read, sure, 0.9, False, lambda a, b: (a, b) == ("q3", "q0"), {})
    assert refusing[:2] == (2, 1)


def test_an_intent_keyed_cache_serves_a_reading_once_its_label_was_asked_and_counts_misreadings_wrong() -> None:
    from bench.head_limits import intent_keyed_on_stream

    names = ["a", "b"]
    asked = ["q0", "q1", "q2", "q3", "q4"]
    truth = ["a", "a", "b", "b", "oos:q4"]
    read = np.array([0, 0, 0, 1, 1])
    sure = np.array([0.99, 0.99, 0.99, 0.5, 0.99])
    # q1 read a, a asked before: right; q2 read a (label b): wrong; q3 under the threshold; q4 out
    # of scope read b, b asked before: wrong.
    assert intent_keyed_on_stream(truth, names, read, sure, 0.9, asked) == (3, 2, 2)
    assert intent_keyed_on_stream(truth, names, read, sure, 0.999, asked) == (0, 0, 2)
