"""actpack.search.largest_batch: the scan finds the largest batch that fits where fits are not
monotone in the batch and records every batch it tried; the bracket is the fast search from a
guess, as the planner's verify and the GPU benchmark run it; a Stop ends either with what it
found so far."""
import pytest

import actpack
from actpack import search


def oracle(fitting):
    """fits(batch) for the batches in `fitting` (a set or a limit); the batches asked."""
    asked = []

    def fits(batch):
        asked.append(batch)
        return batch in fitting if isinstance(fitting, (set, frozenset)) else batch <= fitting
    return fits, asked


def test_it_is_public():
    assert actpack.search.largest_batch is search.largest_batch
    assert "search" in actpack.__all__


def test_the_scan_finds_a_fitting_batch_above_one_that_runs_out():
    # As the suite's ViT at 24 MiB: 221 ran out in fresh processes, 231 trained.
    fitting = set(range(1, 212)) | set(range(226, 236))
    fits, asked = oracle(fitting)
    found = search.largest_batch(fits, 1, 1024)
    assert found.batch == 235 and found.status == "done"
    assert found.upper == 235  # 236 was tried and ran out
    assert len(asked) == len(set(asked))  # never a batch twice
    assert [t["batch"] for t in found.tries] == asked
    assert {t["phase"] for t in found.tries} <= {"coarse", "fine", "every"}
    assert all(t["fits"] == (t["batch"] in fitting) and t["seconds"] >= 0 for t in found.tries)
    # The whole range's grid is tried, whatever fits.
    assert set(search.grid(1, 1024, 1.5)) <= set(asked)
    # A bisection from the estimate, as the planner's old truth search ran, stops below it.
    bracket = search.largest_batch(oracle(fitting)[0], 1, 1024, strategy="bracket", start=211,
                                   up=(1.05,), down=(1.05,))
    assert bracket.batch == 211
    # A band narrower than the fine grid's step is not seen: the scan is no exhaustive search.
    assert search.largest_batch(oracle(set(range(1, 212)) | {229})[0], 1, 1024).batch == 211


@pytest.mark.parametrize("limit", [1, 2, 7, 60, 62, 133, 384, 999, 1000])
def test_the_scan_of_a_monotone_fit_is_exact_and_its_cost_bounded(limit):
    fits, asked = oracle(limit)
    found = search.largest_batch(fits, 1, 1000)
    assert found.batch == limit
    assert found.status == ("ceiling" if limit == 1000 else "done")
    grid = search.grid(1, 1000, 1.5)
    # The grid, then at most 15 finer points, then at most the last fine step's batches.
    assert len(asked) <= len(grid) + 15 + max(1, limit // 32)


def test_the_scan_with_nothing_fitting():
    found = search.largest_batch(oracle(set())[0], 2, 50)
    assert (found.batch, found.value, found.upper) == (0, None, 1)
    assert [t["batch"] for t in found.tries] == search.grid(2, 50, 1.5)


def test_the_answer_s_value_is_what_fits_returned_for_it():
    found = search.largest_batch(lambda b: {"batch": b} if b <= 10 else None, 1, 40)
    assert found.batch == 10 and found.value == {"batch": 10}
    assert found.as_dict()["tries"][0] == {"batch": 1, "fits": True, "phase": "coarse",
                                           "seconds": found.tries[0]["seconds"]}


@pytest.mark.parametrize("limit, start", [(70, 60), (70, 200), (70, 2), (2, 50), (300, 300),
                                          (1000, 16), (5, 5)])
def test_the_bracket_to_its_precision(limit, start):
    fits, asked = oracle(limit)
    found = search.largest_batch(fits, 2, 4096, strategy="bracket", start=start,
                                 precision=0.05)
    assert found.batch <= limit <= found.upper
    assert found.upper - found.batch <= max(0, int(0.05 * found.batch))
    assert len(asked) == len(set(asked)) and len(asked) <= 14
    exact = search.largest_batch(oracle(limit)[0], 2, 4096, strategy="bracket", start=start)
    assert exact.batch == limit


def test_the_planner_s_bracket_goes_down_by_its_factor_and_gives_up_after_its_misses():
    fits, asked = oracle(50)
    found = search.largest_batch(fits, 1, 120, strategy="bracket", start=100, up=None,
                                 down=(1 / 0.95,), misses=8)
    assert asked[:8] == [100, 95, 90, 85, 80, 76, 72, 68]
    assert found.batch == 0 and found.tries[-1]["phase"] == "down"
    fits, asked = oracle(110)
    found = search.largest_batch(fits, 1, 120, strategy="bracket", start=100, up=None,
                                 down=(1 / 0.95,))
    assert asked[0] == 100 and found.batch == 110  # from a start that fits: bisection upward


def test_a_stop_ends_the_search_with_what_it_found():
    def fits(batch):
        if batch > 100:
            raise search.Stop("time", "no time left")
        return batch <= 80
    found = search.largest_batch(fits, 1, 1000)
    assert found.status == "time" and found.batch == 62  # the grid's 1, 2, 3, 5, ..., 62, 93
    assert found.tries[-1]["batch"] == 140
    assert found.tries[-1]["stopped"] == "time" and found.tries[-1]["message"] == "no time left"
    assert "fits" not in found.tries[-1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="low <= high"):
        search.largest_batch(bool, 5, 4)
    with pytest.raises(ValueError, match="strategy"):
        search.largest_batch(bool, 1, 4, strategy="bisect")
    with pytest.raises(ValueError, match="start="):
        search.largest_batch(bool, 1, 4, strategy="bracket")
    with pytest.raises(ValueError, match="coarse"):
        search.largest_batch(bool, 1, 4, coarse=1.0)
