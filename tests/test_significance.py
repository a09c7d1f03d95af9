"""The paired bootstrap (``vllm_eval.measure.significance``) against scipy and scikit-learn on known data."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_eval.measure.significance import STATISTICS, paired_bootstrap


def _units(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-query scores of two systems, the second better by 0.05 on average, correlated as real runs are."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1, n)
    return a, np.clip(a + rng.normal(0.05, 0.1, n), 0, 1)


def test_the_interval_of_a_mean_difference_is_scipys_paired_percentile_bootstrap():
    from scipy.stats import bootstrap

    a, b = _units()
    ours = paired_bootstrap(a, b, "mean", resamples=20_000, seed=1)
    theirs = bootstrap(
        (a, b), lambda x, y, axis=-1: y.mean(axis=axis) - x.mean(axis=axis), paired=True, vectorized=True,
        n_resamples=20_000, method="percentile", random_state=np.random.default_rng(2),
    ).confidence_interval  # fmt: skip
    width = theirs.high - theirs.low
    print(f"\nours [{ours.low:.5f}, {ours.high:.5f}], scipy [{theirs.low:.5f}, {theirs.high:.5f}]")
    assert ours.delta == pytest.approx(b.mean() - a.mean())
    assert abs(ours.low - theirs.low) < 0.05 * width and abs(ours.high - theirs.high) < 0.05 * width
    assert ours.significant and ours.p_value < 0.001


def test_a_run_against_itself_differs_by_nothing_and_a_worse_one_is_found():
    a, b = _units()
    for statistic, units in (("mean", a), ("spearman", np.c_[a, b]), ("average_precision", np.c_[a > 0.5, b])):
        same = paired_bootstrap(units, units, statistic, resamples=500)
        assert same.delta == 0 and same.low == same.high == 0 and same.p_value == 1 and not same.significant
    worse = paired_bootstrap(b, b - np.random.default_rng(3).uniform(0, 0.02, len(b)), "mean", resamples=2_000)
    assert worse.delta < 0 and worse.high < 0 and worse.significant and worse.p_value < 0.01
    noisy = paired_bootstrap(a, a + np.random.default_rng(4).normal(0, 0.2, len(a)), "mean", resamples=2_000)
    assert noisy.low < 0 < noisy.high and not noisy.significant and noisy.p_value > 0.05


def test_the_same_seed_gives_the_same_numbers_and_bad_input_is_named():
    a, b = _units()
    assert paired_bootstrap(a, b, seed=7, resamples=300) == paired_bootstrap(a, b, seed=7, resamples=300)
    assert paired_bootstrap(a, b, seed=7, resamples=300) != paired_bootstrap(a, b, seed=8, resamples=300)
    with pytest.raises(ValueError, match="differ in shape"):
        paired_bootstrap(a, b[:-1])
    with pytest.raises(ValueError, match="statistic must be one of"):
        paired_bootstrap(a, b, "median")
    with pytest.raises(ValueError, match="undefined"):
        paired_bootstrap(np.c_[np.zeros(5), a[:5]], np.c_[np.zeros(5), b[:5]], "average_precision")


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 1), min_size=2, max_size=40),
    scores=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.5, 0.75, 1.0, -1.0]), min_size=40, max_size=40),
    golds=st.lists(st.integers(0, 5), min_size=40, max_size=40),
    seed=st.integers(0, 100),
)
def test_each_statistic_is_the_reference_function_on_any_draw(labels, scores, golds, seed):
    """On whole data and on bootstrap draws (repeated units, ties): ``average_precision`` is scikit-learn's
    ``average_precision_score``, ``spearman`` is ``scipy.stats.spearmanr`` (mteb's STS score)."""
    from scipy.stats import spearmanr
    from sklearn.metrics import average_precision_score

    n = len(labels)
    lab, sc, gold = np.array(labels, float), np.array(scores[:n]), np.array(golds[:n], float)
    draws = np.vstack([np.arange(n), np.random.default_rng(seed).integers(0, n, size=(3, n))])
    ap = STATISTICS["average_precision"](np.c_[lab, sc], draws)
    rho = STATISTICS["spearman"](np.c_[gold, sc], draws)
    for row, idx in enumerate(draws):
        if lab[idx].sum() > 0:
            assert ap[row] == pytest.approx(average_precision_score(lab[idx], sc[idx]), abs=1e-12)
        else:
            assert np.isnan(ap[row])
        if np.ptp(gold[idx]) > 0 and np.ptp(sc[idx]) > 0:
            assert rho[row] == pytest.approx(spearmanr(gold[idx], sc[idx]).statistic, abs=1e-12)
        else:
            assert np.isnan(rho[row])


_TAGS = st.sampled_from(["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC"])


@settings(max_examples=60, deadline=None)
@given(
    sentences=st.lists(st.tuples(st.lists(_TAGS, min_size=1, max_size=8), st.lists(_TAGS, min_size=8, max_size=8)),
                       min_size=1, max_size=12),
    seed=st.integers(0, 100),
)  # fmt: skip
def test_entity_f1_units_give_seqevals_f1_on_the_whole_and_on_draws(sentences, seed):
    """token_classify's units (2 TP, predicted + gold entities per sentence) under ``ratio``: seqeval's micro F1 (the
    command's ``f1``) of the sentences a draw holds, repeats included."""
    from seqeval.metrics import f1_score

    from vllm_eval.evaluation.scoring.units import sample_units

    rows = [{"predicted": p, "target": g[: len(p)]} for p, g in sentences]
    statistic, units = sample_units("f1", rows)
    assert statistic == "ratio" and units.shape == (len(rows), 2)
    n = len(rows)
    draws = np.vstack([np.arange(n), np.random.default_rng(seed).integers(0, n, size=(3, n))])
    got = STATISTICS["ratio"](units, draws)
    for row, idx in enumerate(draws):
        gold, pred = [rows[i]["target"] for i in idx], [rows[i]["predicted"] for i in idx]
        if units[idx, 1].sum() > 0:
            assert got[row] == pytest.approx(f1_score(gold, pred, zero_division=0), abs=1e-12)
        else:
            assert np.isnan(got[row])
    assert sample_units("bleu", rows) is None and sample_units("accuracy", rows) is None  # no field: no units


def test_a_sweeps_comparisons_in_processes_are_those_of_one_process(tmp_path, caplog):
    """``sweep_significance`` with comparisons in forked children (where the units are big: a GPU host's sweep spent
    26 s on them one after another) gives every model's differences exactly as done in this process."""
    from vllm_eval.evaluation.scoring.units import _Recorder, write_units
    from vllm_eval.measure.significance import _comparison_workers, sweep_significance

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400).astype(float)
    folders = []
    for m in range(3):
        queries = _Recorder("ndcg_at_10")
        queries.put("mean", np.clip(_units(300, seed=m)[1], 0, 1), ids=[f"q{i}" for i in range(300)])
        pairs = _Recorder("max_ap")
        pairs.put("max_average_precision", np.c_[labels, labels[:, None] + rng.normal(0, 1 + m, (400, 5))])
        write_units(tmp_path / f"m{m}" / "units" / "Queries.npz", "Queries", queries)
        write_units(tmp_path / f"m{m}" / "units" / "Pairs.npz", "Pairs", pairs)
        folders.append(tmp_path / f"m{m}")
    names = ["m0", "m1", "m2"]
    here = sweep_significance(names, folders, workers=1)
    with caplog.at_level("INFO", logger="vllm_eval.measure.significance"):
        assert sweep_significance(names, folders, workers=2) == here
    assert "2 models against the first" in caplog.text and "in 2 processes" in caplog.text
    assert "computing it here" not in caplog.text  # the forked child answered (utils.forked warns where it did not)
    assert sorted(here) == ["m1", "m2"] and all(sorted(d) == ["Pairs", "Queries"] for d in here.values())
    assert all(d["Pairs"]["delta"] < 0 and d["Pairs"]["significant"] for d in here.values())  # noisier: lower max AP
    assert _comparison_workers(2, folders[0], None) == 1  # a few KB of units: not worth a process
