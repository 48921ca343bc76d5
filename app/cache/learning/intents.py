"""Fitting and calibrating a team's intent head (issue #46).

The head is a linear softmax over the team's intents on the deployment's unit-length sentence
vectors (Casanueva et al. 2020 put such light heads on frozen encoders), fitted by full-batch Adam
with a small L2 penalty, from the intents' prototypes. Numpy only: 15,000 phrasings of 150
intents fit in seconds on this machine (docs/QUALITY.md).

**The serving rule and its guarantee.** A candidate is served by the intent rule when the asked
question and a cached one in the band are given the same intent with confidence at least ``t``.
``t`` is chosen on the team's data alone by Learn-then-Test (Angelopoulos et al.): folds of the
phrasings are held out, and in each fold a tenth of the intents is held out whole, so their
phrasings stand for questions of no intent of the team's (out of scope). Every phrasing is read
by the head fitted without its fold (cross-fitting), and the file is replayed as a warm cache
would meet it: each phrasing asks, every other phrasing is the cache, read by the head that held
it out (its nearest 8 at the category's floor or above, as the KNN finds them, less those the
guards set aside, as they do before the rule), and the rule serves it or not. The whole file
as the cache, not one fold's share of it: with 10 phrasings an intent a fold held about two of
each, too few for the rule to meet its own intent, and no threshold could be shown (issue #46;
docs/QUALITY.md). A file of up to ``SMALL_FILE`` phrasings is cut in ``SMALL_FILE_FOLDS`` folds, so
that each head learns from nine tenths of it;
served, it is wrong when the cached phrasing has another label, or always when its own intent was
held out. The candidate thresholds are a grid fixed before any label is read (the confidences at
which 10%, 15%, ... 95% of the held-out phrasings are at or above), walked as two fixed sequences,
most confident first: one from the top, one from the 30% most confident down, each at
``delta / 2`` (Bonferroni), each starting at the first threshold where the rule serves enough
held-out phrasings to show the bound at all (it depends on no label). Along a sequence the null
"wrong share of the rule's hits > error_bound" is tested with the exact binomial tail and the
sequence stops at the first null it keeps; the rule serves at the lowest threshold either
sequence rejected. So with 95% confidence (or the category's, if higher), over the held-out readings
replayed as a stream, the rule's wrong share is at most the category's ``error_bound``,
out-of-scope questions counted as wrong. Why two: a few mislabelled phrasings among the most
confident stop a single sequence before it certifies anything (CLINC150's train split:
"how is the weather today" labelled `maybe`), and Bonferroni over all 18 thresholds tests each
at a level no team's data reaches (docs/QUALITY.md). A team with too few phrasings to show it (:func:`fewest_to_show`: 368
clean hits at 1%) gets a rule that serves nothing, and is told so.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec
import numpy as np

from app.cache.decision.rules import BAND_ROWS, TRIAL_CONFIDENCE, intent_rule_serves
from app.cache.decision.stats import binomial_tail, evidence_above
from app.cache.storage.intents import LIKELY_FLOOR, softmax_and_energy, softmax_predict

# Learn-then-Test's risk level: the threshold holds with at least this probability (95%, or the
# category's confidence where that is higher).
DELTA = 0.05
# The pairs of intents most mixed up that a load reports (the console's twins).
CONFUSED_SHOWN = 10
FOLDS = 5
# A small file is cut finer: each head then learns from nine tenths of it, not four fifths.
SMALL_FILE = 5_000
SMALL_FILE_FOLDS = 10
# Askers whose similarities to the whole file are held at once (rows x phrasings floats).
ASKERS_AT_ONCE = 1_024
# Share of the intents held out whole in each fold, to stand for questions of no known intent.
UNKNOWN_SHARE = 0.1
EPOCHS = 150
# Barely any shrinkage: at 1e-4 the head's confidences flattened (CLINC150's train split: 0.38
# of a perfect cache at 1% wrong in hindsight, against 0.61 at 1e-6; docs/QUALITY.md).
L2 = 1e-6
LEARNING_RATE = 0.05
# The grid of thresholds tested: the confidences at which these shares of the held-out phrasings
# are at or above (it depends on no label).
GRID_SHARES = tuple(round(0.10 + 0.05 * i, 2) for i in range(18))
# The probation walk's levels below the grid (fixed before any label is read): a head serves on
# probation only where it gives the asked intent at least an even chance.
PROBATION_LEVELS = (0.9, 0.8, 0.7, 0.6, 0.5)
# Where the fixed sequences begin on the grid (each tested at delta / len(CHAIN_STARTS)).
CHAIN_STARTS = (0.10, 0.30)


class SoftmaxHead:
    """A linear softmax over a team's intents, in scikit-learn's estimator contract: parameters
    in the constructor, :meth:`fit` returns the head, ``classes_``, :meth:`predict_proba` and
    :meth:`predict`; the fitted weights are ``coef_`` ``(dims, classes)`` and ``intercept_``.

    Fitted by full-batch Adam from the intents' prototypes (their phrasings' mean direction),
    numpy only. A class without phrasings keeps a zero prototype and learns only to stay unlikely.

    Args:
        n_classes: Intents the head reads, labelled ``0 .. n_classes - 1`` (some may have no
            phrasings in a fold); ``None``: those in ``y``, from 0 to its largest label.
        epochs: Adam's full-batch steps.
        l2: The weights' shrinkage.
        learning_rate: Adam's step.
        seed: Kept for the contract (the fit is deterministic: full batches from the prototypes).
    """

    def __init__(self, *, n_classes: int | None = None, epochs: int = EPOCHS, l2: float = L2,
                 learning_rate: float = LEARNING_RATE, seed: int = 0) -> None:
        self.n_classes = n_classes
        self.epochs = epochs
        self.l2 = l2
        self.learning_rate = learning_rate
        self.seed = seed

    def get_params(self, deep: bool = True) -> dict[str, object]:
        return {"n_classes": self.n_classes, "epochs": self.epochs, "l2": self.l2,
                "learning_rate": self.learning_rate, "seed": self.seed}

    def set_params(self, **params: object) -> SoftmaxHead:
        for name, value in params.items():
            if name not in self.get_params():
                raise ValueError(f"SoftmaxHead has no parameter {name!r}")
            setattr(self, name, value)
        return self

    def fit(self, X: np.ndarray, y: np.ndarray) -> SoftmaxHead:
        x = np.asarray(X, dtype=np.float32)
        labels = np.asarray(y, dtype=int)
        classes = self.n_classes if self.n_classes is not None else int(labels.max()) + 1
        n = x.shape[0]
        onehot = np.zeros((n, classes), dtype=np.float32)
        onehot[np.arange(n), labels] = 1.0
        counts = np.maximum(onehot.sum(axis=0), 1.0)
        prototypes = (onehot.T @ x) / counts[:, None]
        prototypes /= np.maximum(np.linalg.norm(prototypes, axis=1, keepdims=True), 1e-9)
        weights = (prototypes.T * 10.0).astype(np.float32)
        bias = np.zeros(classes, dtype=np.float32)
        moments = [np.zeros_like(weights), np.zeros_like(weights), np.zeros_like(bias), np.zeros_like(bias)]
        beta1, beta2 = 0.9, 0.999
        for step in range(1, self.epochs + 1):
            logits = x @ weights + bias
            logits -= logits.max(axis=1, keepdims=True)
            probabilities = np.exp(logits)
            probabilities /= probabilities.sum(axis=1, keepdims=True)
            error = (probabilities - onehot) / n
            grads = (x.T @ error + self.l2 * weights, error.sum(axis=0))
            for i, (param, grad) in enumerate(zip((weights, bias), grads, strict=True)):
                m, v = moments[2 * i], moments[2 * i + 1]
                m *= beta1
                m += (1 - beta1) * grad
                v *= beta2
                v += (1 - beta2) * grad * grad
                param -= self.learning_rate * (m / (1 - beta1 ** step)) / (np.sqrt(v / (1 - beta2 ** step)) + 1e-8)
        self.classes_ = np.arange(classes)
        self.coef_, self.intercept_ = weights, bias
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        logits = np.asarray(X, dtype=np.float32) @ self.coef_ + self.intercept_
        logits -= logits.max(axis=1, keepdims=True)
        probabilities: np.ndarray = np.exp(logits)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        return probabilities

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(self.classes_[self.predict_proba(X).argmax(axis=1)])

    def read(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(intent index, confidence) of each row: what the served head computes
        (``IntentHead.predict``, from the same weights)."""
        return softmax_predict(self.coef_, self.intercept_, X)


def fewest_to_show(rate: float, delta: float = DELTA, tests: int = 1) -> int:
    """Served phrasings needed before even a clean record rejects "wrong share > rate" at
    ``delta / tests``: with fewer, no threshold can be certified (at 1% and 95%: 299 for one test,
    368 for each of two sequences)."""
    return math.ceil(math.log(delta / tests) / math.log1p(-rate))


def best_bound_shown(phrasings: int, delta: float = DELTA, tests: int = 1) -> float:
    """The lowest wrong share that ``phrasings`` held-out phrasings, every one served and none
    wrong, could show at ``delta / tests``: the inverse of :func:`fewest_to_show`."""
    return float(1.0 - (delta / tests) ** (1.0 / max(1, phrasings)))


def why_it_serves_nothing(*, intents: int, phrasings: int, bound: float, delta: float, share: float = 1.0,
                          on_probation: bool = False) -> str:
    """In plain words, why a calibration certified nothing and what would change that (``bound``:
    the intent rule's, ``share`` of the category's ``error_bound``); ``on_probation``: the rule
    serves on probation meanwhile (said after this)."""
    tests = len(CHAIN_STARTS)
    needed = fewest_to_show(bound, delta, tests)
    best = best_bound_shown(phrasings, delta, tests)
    per_intent = math.ceil(needed / max(1, intents))
    needed_on_trial = fewest_to_show(bound / share, delta)  # on the traffic itself: the category's bound
    if on_probation:
        return (f"certifies nothing before traffic: to promise at most {bound:.2%} wrong hits ({1 - delta:.0%} sure) "
                f"from the file alone, its phrasings, each held out in turn, must be served at least {needed} times "
                f"with none wrong; this file has {phrasings} ({phrasings / max(1, intents):.1f} per intent)")
    return (f"serves nothing yet. To promise at most {bound:.2%} wrong hits ({1 - delta:.0%} sure), the team's own "
            f"phrasings, each held out in turn, must be served at least {needed} times with none wrong; this file has "
            f"{phrasings} ({phrasings / max(1, intents):.1f} per intent), so the lowest it could show is {best:.1%} wrong, "
            f"however accurate the head. To serve: about {per_intent} phrasings per intent ({max(0, needed - phrasings)} "
            f"more in all, more if some are read unsure), or an error_bound of {best / share:.1%} for the category "
            f"(schemas/policy.yaml). Meanwhile the rule is on trial: the pairs it would serve (both questions read "
            f"as one intent at {TRIAL_CONFIDENCE:.0%} or more) are answered by the model and counted by confidence, "
            f"and from the lowest confidence whose pairs show the bound ({needed_on_trial} with none wrong) it serves "
            f"them; the head already sets aside cached answers it reads as another intent, and the category's other "
            f"rules serve as without intents.")


class Calibration(msgspec.Struct, frozen=True, kw_only=True):
    """What the held-out folds said.

    Attributes:
        threshold: The confidence the rule serves at (above 1: it serves nothing).
        accuracy: Cross-validated accuracy on the known intents' phrasings.
        served_share: Share of the known intents' held-out phrasings at the threshold or above.
        held_out_wrong: Wrong share of all held-out phrasings at the threshold or above (unknown intents included).
        held_out: Held-out predictions made (every phrasing once).
        unknown_served: Phrasings of held-out intents at the threshold or above.
        confused: The intents the folds mixed up most: (intent, read as, times), most first.
    """

    threshold: float
    accuracy: float
    served_share: float
    held_out_wrong: float
    held_out: int
    unknown_served: int
    confused: list[tuple[int, int, int]] = msgspec.field(default_factory=list)
    # The confidence the rule may serve from on probation (above 1: none), below ``threshold``:
    # the lowest of the grid reached walking down from the most confident while the held-out
    # replay's wrong share stays within the bound (read once the level serves 1 / bound held-out
    # phrasings, so that one wrong alone is not over it; before that, until the test that stops
    # an intent on traffic, ``evidence_above``, is sure it is over): what the file shows, not a
    # guarantee; the traffic's checked record is the guarantee (app/cache/decision/rules.py). Not
    # only "until shown over the bound": where a file's twins start, the traffic's are wrong 2-3
    # times as often as its held-out phrasings (CLINC150, 10 per intent: 1.55% held out at 0.782,
    # 2.5% of its probation hits under 0.9 on the streams; docs/experiments/quality-history.md).
    probation: float = 1.01
    # At that confidence: the held-out phrasings served and the wrong share among them.
    probation_served: float = 0.0
    probation_wrong: float = 0.0
    # The veto's floor on two questions' chance of one intent (:func:`shared_chance_floor`), and
    # the shares of the file's same-intent and other-intent neighbours below it.
    veto_below: float = 0.0
    veto_same: float = 0.0
    veto_other: float = 0.0
    # Per intent, how confidently the held-out out-of-scope stand-ins were read as it (:func:`stand_in_reach`).
    stand_in_reach: list[float] = msgspec.field(default_factory=list)
    # The energy below which a question is outside what the head knows (:func:`domain_floor`); ``None``: not measured.
    domain_floor: float | None = None


class Fold(msgspec.Struct, frozen=True, kw_only=True):
    """Held-out readings as a stream: each phrasing asks, the others are the cache (the whole
    file, each read by the head that held it out: :func:`held_out_folds`)."""

    labels: np.ndarray
    predicted: np.ndarray
    confidence: np.ndarray
    unknown: np.ndarray
    neighbours: np.ndarray  # (n, NEIGHBOURS): the nearest other phrasings, most similar first; -1: none in the band
    # (n, OF_INTENT): the nearest other phrasings read as the asker's intent, at any similarity (-1: none)
    of_intent: np.ndarray
    # Per intent, whether the rule may serve it (shared, not out of scope); ``None``: every one.
    servable: np.ndarray | None = None
    # (n, classes): each phrasing's held-out probability of every intent; ``None``: not kept.
    probabilities: np.ndarray | None = None
    # (n, NEIGHBOURS): the nearest other phrasings at any similarity (the veto's floor is measured there).
    nearest_any: np.ndarray | None = None
    # (n,): each phrasing's held-out energy (``softmax_and_energy``); ``None``: not kept.
    energy: np.ndarray | None = None


NEIGHBOURS = BAND_ROWS
# Rows the intent rule looks at beyond the band when the band has none of the asked intent: the
# nearest cached questions the head read as that intent (a KNN filtered by intent).
OF_INTENT = 4
# Whether the guards set a pair aside (the phrasings' indices: the asker's, the cached one's).
Refused = Callable[[int, int], bool]
# (asker, cached, the asker's reading): the intent rule may serve past the guards' refusal.
Overrulable = Callable[[int, int, int], bool]


def folds_for(phrasings: int) -> int:
    """How many folds a file of this many phrasings is cut in (``SMALL_FILE_FOLDS`` up to ``SMALL_FILE``)."""
    return SMALL_FILE_FOLDS if phrasings <= SMALL_FILE else FOLDS


def held_out_folds(vectors: np.ndarray, labels: np.ndarray, classes: int, floor: float, *, folds: int | None = None,
                   unknown_share: float = UNKNOWN_SHARE, seed: int = 0, epochs: int = EPOCHS,
                   refused: Refused | None = None, near: np.ndarray | None = None,
                   out_of_scope: np.ndarray | None = None, servable: np.ndarray | None = None,
                   beyond_floor: float = -1.0, overrulable: Overrulable | None = None) -> list[Fold]:
    """Every phrasing read by a head fitted without its fold (and without a tenth of the intents,
    whose phrasings stand for unknown questions), with its nearest other phrasings of the whole
    file at ``floor`` or above, as the cache's KNN would find them, each read by the head that held
    it out; a neighbour the guards refuse (``refused``) is set aside as the rules set it aside
    before the intent rule. ``near``: the index's vectors of the phrasings when the head reads
    with another embedder (the KNN and its floor are the index's), else ``vectors``. One
    :class:`Fold`: the file as one stream. ``folds``: :func:`folds_for` the file when not given.
    ``out_of_scope`` (per intent): the team's own out-of-scope questions; when the file has any,
    they are what is unknown (held out fold by fold, read by a head that learnt the rest of them),
    and no intent is held out to stand for them. ``servable`` (per intent): what the rule may serve.
    ``beyond_floor``: the nearest phrasings read as the asker's intent are looked for from this
    similarity (``near``'s) on, as the rule looks beyond the band. ``overrulable``: of the pairs
    ``refused`` refuses, those that stay for an asker read as the given intent, as the intent rule
    overrules the guards there (``app.cache.decision.rules.intent_may_overrule``)."""
    near = vectors if near is None else near
    folds = folds_for(len(labels)) if folds is None else folds
    rng = np.random.default_rng(seed)
    fold_of = np.empty(len(labels), dtype=int)
    for label in range(classes):
        members = np.flatnonzero(labels == label)
        rng.shuffle(members)
        fold_of[members] = (np.arange(len(members)) + rng.integers(folds)) % folds
    order = rng.permutation(classes)
    scoped = out_of_scope is not None and bool(np.any(out_of_scope))
    # Stand-ins for unknown questions: the team's own out-of-scope ones where it gave some; else a
    # tenth of its intents, held out (none of fewer than ten).
    held = 0 if scoped else math.floor(unknown_share * classes)
    probabilities = np.zeros((len(labels), classes), dtype=np.float32)
    energy = np.zeros(len(labels), dtype=np.float64)
    unknown = np.zeros(len(labels), dtype=bool)
    for fold in range(folds):
        start = (fold * held) % max(1, classes)
        hidden = order[start:start + held] if held else np.array([], dtype=int)
        is_hidden = np.isin(labels, hidden)
        train, test = (fold_of != fold) & ~is_hidden, fold_of == fold
        head = SoftmaxHead(n_classes=classes, epochs=epochs, seed=seed).fit(vectors[train], labels[train])
        probabilities[test], energy[test] = softmax_and_energy(head.coef_, head.intercept_, vectors[test])
        unknown[test] = is_hidden[test] | (out_of_scope[labels[test]] if scoped and out_of_scope is not None else False)
    predicted, sure = probabilities.argmax(axis=1), probabilities.max(axis=1).astype(np.float64)
    nearest = np.full((len(labels), NEIGHBOURS), -1)
    nearest_any = np.full((len(labels), NEIGHBOURS), -1)
    of_intent = np.full((len(labels), OF_INTENT), -1)
    for first in range(0, len(labels), ASKERS_AT_ONCE):
        rows = np.arange(first, min(first + ASKERS_AT_ONCE, len(labels)))
        similarity = near[rows] @ near.T
        similarity[np.arange(len(rows)), rows] = -np.inf  # not itself
        nearest_any[rows] = _top(similarity, NEIGHBOURS, -np.inf)
        found = nearest_any[rows]
        at = np.take_along_axis(similarity, np.maximum(found, 0), axis=1)
        nearest[rows] = np.where((found >= 0) & (at >= floor), found, -1)
        same = np.where(predicted[None, :] == predicted[rows, None], similarity, -np.inf)
        of_intent[rows] = _top(same, OF_INTENT, beyond_floor)
    if refused is not None:
        for found in (nearest, of_intent):
            for row, column in zip(*np.nonzero(found >= 0), strict=True):
                asker, cached = int(row), int(found[row, column])
                if refused(asker, cached) and not (
                        overrulable is not None and overrulable(asker, cached, int(predicted[asker]))):
                    found[row, column] = -1
    return [Fold(labels=labels, predicted=predicted, confidence=sure, unknown=unknown, neighbours=nearest,
                 of_intent=of_intent, servable=servable, probabilities=probabilities, nearest_any=nearest_any,
                 energy=energy)]


def _top(similarity: np.ndarray, count: int, floor: float) -> np.ndarray:
    """Per row, the columns of the ``count`` highest similarities that are finite and at or above
    ``floor``, most similar first; -1 where there are fewer."""
    rows, columns = similarity.shape
    result = np.full((rows, count), -1)
    take = min(count, columns)
    if take == 0:
        return result
    picked = np.argpartition(-similarity, take - 1, axis=1)[:, :take]
    values = np.take_along_axis(similarity, picked, axis=1)
    ranked = np.argsort(-values, axis=1, kind="stable")
    picked, values = np.take_along_axis(picked, ranked, axis=1), np.take_along_axis(values, ranked, axis=1)
    result[:, :take] = np.where(np.isfinite(values) & (values >= floor), picked, -1)
    return result


def _first_match(fold: Fold, candidates: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(found, which) per asker: the first candidate read as the asker's intent at ``threshold``."""
    valid = candidates >= 0
    safe = np.where(valid, candidates, 0)
    matches = valid & intent_rule_serves(fold.predicted[:, None], fold.confidence[:, None], fold.predicted[safe],
                                         fold.confidence[safe], threshold)
    return matches.any(axis=1), safe[np.arange(len(safe)), matches.argmax(axis=1)]


def rule_outcomes(fold: Fold, threshold: float, beyond_band: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(served, wrong) per asking phrasing: served when it and one of its neighbours in the band
    are given the same intent at ``threshold`` or above, else (none in the band) one of the
    nearest phrasings read as its intent at any similarity, as the intent rule looks beyond the
    band (``beyond_band``); wrong when that phrasing has another label, or the asker's intent is
    unknown to the head (out of scope: always wrong)."""
    in_band, band_first = _first_match(fold, fold.neighbours, threshold)
    beyond, beyond_first = _first_match(fold, fold.of_intent, threshold)
    beyond &= beyond_band
    first = np.where(in_band, band_first, beyond_first)
    served = in_band | beyond  # the predicate holds the asker to the threshold too
    if fold.servable is not None:
        served &= fold.servable[fold.predicted]  # an intent the rule never serves (not shared, out of scope)
    wrong = served & ((fold.labels[first] != fold.labels) | fold.unknown)
    return served, wrong


# The veto's floor is where this share of the file's held-out pairs of one intent sit (each
# phrasing and its nearest, at any similarity): what it may cost the rules' reach on the file.
VETO_COST = 0.01
# Never above the chance the older veto left a question of the cached row's intent (1 - 0.8).
VETO_MOST = 0.2
# Fewer same-intent neighbour pairs than this: no floor (the quantile would be a guess).
VETO_PAIRS = 100


def shared_chances(fold: Fold, asker: np.ndarray, cached: np.ndarray) -> np.ndarray:
    """The head's probability that each pair shares an intent, from held-out readings: the sum
    over intents of the two probabilities' product, the cached side's under ``LIKELY_FLOOR``
    counted as 0 (as its document keeps them: ``IntentGuess.shared_chance``)."""
    assert fold.probabilities is not None
    kept = np.where(fold.probabilities >= LIKELY_FLOOR, fold.probabilities, 0.0)
    return np.asarray((fold.probabilities[asker] * kept[cached]).sum(axis=1))


def shared_chance_floor(fold: Fold) -> tuple[float, float, float]:
    """(floor, same, other): the veto sets aside a row whose question and the asked one the head
    gives less than ``floor`` of a chance of one intent; ``floor`` is the :data:`VETO_COST`
    quantile of that chance over the file's held-out pairs of one label among each phrasing's
    nearest (at any similarity: a small file has few pairs in the band, and pairs further apart
    are read less surely, so the floor errs low), at most :data:`VETO_MOST`; ``same`` and
    ``other``: the shares of same-label and other-label pairs below it. Out-of-scope phrasings
    are left out of both."""
    near = fold.nearest_any if fold.nearest_any is not None else fold.neighbours
    rows, columns = np.nonzero(near >= 0)
    cached = near[rows, columns]
    known = ~fold.unknown[rows] & ~fold.unknown[cached]
    rows, cached = rows[known], cached[known]
    same = fold.labels[rows] == fold.labels[cached]
    if fold.probabilities is None or int(same.sum()) < VETO_PAIRS:
        return 0.0, 0.0, 0.0
    chances = shared_chances(fold, rows, cached)
    floor = float(min(VETO_MOST, np.quantile(chances[same], VETO_COST)))
    below = chances < floor
    return floor, float(below[same].mean()), float(below[~same].mean()) if (~same).any() else 0.0


# The head's word counts for questions it reads at least as strongly as all but this share of the
# file's own held-out phrasings: what the domain gate may cost the veto on the team's traffic.
DOMAIN_COST = 0.01


def domain_floor(fold: Fold) -> float | None:
    """The :data:`DOMAIN_COST` quantile of the held-out energies of the team's own phrasings (out
    of scope ones apart): a question read more weakly is of none of its topics, and the head's
    word on a pair with it (the veto's floor, the entry record's even chance) says nothing.
    Measured on the folds' heads, whose energies run lower than the whole file's head's: the
    served head calls more questions the team's, so the gate errs toward the veto.
    ``None``: no energies kept, or no phrasing of the team's."""
    if fold.energy is None:
        return None
    known = ~fold.unknown
    if not known.any():
        return None
    return float(np.quantile(fold.energy[known], DOMAIN_COST))


def stand_in_reach(fold: Fold, classes: int) -> list[float]:
    """Per intent, the highest confidence at which a held-out out-of-scope phrasing (the file's
    own or Strata's stand-ins; or an intent held out, for a file without them) was read as that
    intent, where the rule serves it (0: none read so). The rule reads the highest of them: a
    cached question read no surer than that may be out of scope (``HeadMeta.stand_in_reach``
    says why not each intent's own); the list is what the load reports."""
    servable = fold.servable[fold.predicted] if fold.servable is not None else np.ones(len(fold.labels), dtype=bool)
    reach = np.zeros(classes)
    stray = fold.unknown & servable
    np.maximum.at(reach, fold.predicted[stray], fold.confidence[stray])
    return [float(r) for r in reach]


def _trial(held: list[Fold], tau: float, beyond_band: bool) -> tuple[float, np.ndarray, np.ndarray]:
    outcomes = [rule_outcomes(f, tau, beyond_band) for f in held]
    return tau, np.concatenate([o[0] for o in outcomes]), np.concatenate([o[1] for o in outcomes])


def calibrate(vectors: np.ndarray, labels: np.ndarray, classes: int, error_bound: float, floor: float, *,
              delta: float = DELTA, seed: int = 0, folds: int | None = None, epochs: int = EPOCHS,
              refused: Refused | None = None, near: np.ndarray | None = None,
              beyond_band: bool = False, out_of_scope: np.ndarray | None = None,
              servable: np.ndarray | None = None, beyond_floor: float = -1.0,
              overrulable: Overrulable | None = None) -> Calibration:
    """The threshold of the intent rule under ``error_bound`` (the module's procedure); ``near``
    and ``overrulable`` as in :func:`held_out_folds`; ``beyond_band``: the
    rule also looks at the nearest rows read as the asked intent outside the band (a head on a
    second embedder)."""
    held = held_out_folds(vectors, labels, classes, floor, folds=folds, seed=seed, epochs=epochs, refused=refused,
                          near=near, out_of_scope=out_of_scope, servable=servable, beyond_floor=beyond_floor,
                          overrulable=overrulable)
    confidence = np.concatenate([f.confidence for f in held])
    unknown = np.concatenate([f.unknown for f in held])
    right = np.concatenate([(f.predicted == f.labels) & ~f.unknown for f in held])
    threshold = 1.01
    served, wrong = np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    each = delta / len(CHAIN_STARTS)
    enough = fewest_to_show(error_bound, each)
    trials = {share: _trial(held, float(np.quantile(confidence, 1.0 - share)), beyond_band) for share in GRID_SHARES}
    for start in CHAIN_STARTS:
        begun = False
        for share in (s for s in GRID_SHARES if s >= start - 1e-9):
            tau, trial_served, trial_wrong = trials[share]
            begun = begun or int(trial_served.sum()) >= enough  # label-free: how much it serves
            if not begun:
                continue
            if binomial_tail(int(trial_wrong.sum()), int(trial_served.sum()), error_bound) > each:
                break
            if tau < threshold:
                threshold, served, wrong = tau, trial_served, trial_wrong
    probation, probation_served, probation_wrong = 1.01, 0.0, 0.0
    # Most confident first; stops at the first level wrong more often than the bound. Below the
    # grid (whose last level, the 95% quantile, sits near 1 where the held-out phrasings are
    # mostly out-of-scope questions read confidently as such), fixed levels down to a majority.
    lowest = min(tau for tau, _, _ in trials.values())
    levels = [trials[share] for share in GRID_SHARES] + [
        _trial(held, level, beyond_band) for level in PROBATION_LEVELS if level < lowest]
    for tau, trial_served, trial_wrong in levels:
        served_count, wrong_count = int(trial_served.sum()), int(trial_wrong.sum())
        # A share is read once one wrong is not more than the bound by itself; below that, only
        # what the file is sure of (the test that stops an intent on traffic).
        if (served_count >= 1 / error_bound and wrong_count > error_bound * served_count) \
                or evidence_above(wrong_count, served_count, error_bound) >= 1 / delta:
            break
        if served_count and tau < threshold:
            probation = tau
            probation_served = float((trial_served & ~unknown).sum() / max(1, (~unknown).sum()))
            probation_wrong = float(trial_wrong.sum() / served_count)
    veto_below, veto_same, veto_other = shared_chance_floor(held[0])
    known = ~unknown
    mixed: dict[tuple[int, int], int] = {}
    for fold in held:
        for label, read in zip(fold.labels[~fold.unknown], fold.predicted[~fold.unknown], strict=True):
            if label != read:
                mixed[(int(label), int(read))] = mixed.get((int(label), int(read)), 0) + 1
    confused = sorted(((a, b, n) for (a, b), n in mixed.items()), key=lambda t: -t[2])[:CONFUSED_SHOWN]
    return Calibration(
        confused=confused,
        threshold=threshold, accuracy=float(right[known].mean()) if known.any() else 0.0,
        served_share=float((served & known).sum() / max(1, known.sum())) if served.size else 0.0,
        held_out_wrong=float(wrong.sum() / max(1, served.sum())) if served.size else 0.0, held_out=len(labels),
        unknown_served=int((served & unknown).sum()) if served.size else 0,
        probation=probation, probation_served=probation_served, probation_wrong=probation_wrong,
        veto_below=veto_below, veto_same=veto_same, veto_other=veto_other, stand_in_reach=stand_in_reach(held[0], classes),
        domain_floor=domain_floor(held[0]))
