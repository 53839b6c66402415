"""Adaptive grids (race.run.adaptive): which pilots each policy asks for, checked by hand."""
import math

import pytest

from race.config.configfile import ConfigError
from race.run.adaptive import adaptive_cap, adaptive_needed, allocate_seeds, informative_seeds, resolve_adaptive, successive_halving
def test_the_adaptive_budget_is_half_the_grid_with_at_least_one_second_seed():
    assert adaptive_cap(4, 3) == 6 and adaptive_cap(5, 4) == 10
    assert adaptive_cap(3, 2) == 4          # half would be 3 = one seed everywhere: one more
    assert adaptive_cap(4, 1) == 4          # one seed per point: nothing to add


def test_successive_halving_rungs():
    grid = [0.3, 0.5, 0.7, 0.9]
    keys, final = successive_halving(grid, 3, {})
    assert keys == [(r, 0) for r in grid] and not final
    rung0 = {(0.3, 0): 0.1, (0.5, 0): 0.4, (0.7, 0): 0.3, (0.9, 0): 0.2}
    keys, final = successive_halving(grid, 3, rung0)
    assert keys[4:] == [(0.5, 1), (0.7, 1)] and not final     # best ⌈4/2⌉ points; rung 1 must finish first
    keys, final = successive_halving(grid, 3, {**rung0, (0.5, 1): 0.4, (0.7, 1): 0.3})
    assert len(keys) == 6 and final                             # the cap (6) is spent: three rungs in all


def test_informative_trend_puts_the_extra_seeds_at_the_ends():
    """Not concave: the log-linear slope, whose weights (x − x̄) are largest at both ends; the tie
    between the ends goes to the better score, then the other end has the larger gain."""
    x = [-1.0, -1 / 3, 1 / 3, 1.0]
    grid = [math.exp(v) for v in x]
    n = allocate_seeds(grid, {r: v for r, v in zip(grid, x)}, extra=2, max_seeds=3)
    assert [n[r] for r in grid] == [2, 1, 1, 2]


def test_informative_peak_puts_the_extra_seeds_where_the_curvature_is_measured():
    """x = −1, 0, 1 with y = −x²: c = (y₋ − 2y₀ + y₊)/2 has weights (½, −1, ½), the vertex
    (at 0, margin 1) weights (−¼, 0, ¼), so the curvature term Σ w²/n dominates J:
    a middle seed gives ¼ + ½ + ¼ = 1.0 < an end's ⅛ + 1 + ¼; a second middle seed
    ¼ + ⅓ + ¼ < ⅛ + ½ + ¼; the middle is then full (3 seeds) and the ends tie: lower ρ."""
    grid = [math.exp(-1), 1.0, math.exp(1)]
    n = allocate_seeds(grid, {grid[0]: -1.0, grid[1]: 0.0, grid[2]: -1.0}, extra=3, max_seeds=3)
    assert [n[r] for r in grid] == [2, 3, 1]


def test_informative_waits_for_rung_0_then_asks_for_the_rest_at_once():
    grid = [0.45, 0.6, 0.73, 0.84]
    keys, final = informative_seeds(grid, 3, {(0.45, 0): 0.5})
    assert keys == [(r, 0) for r in grid] and not final
    scores = {(r, 0): -(math.log(r) - math.log(0.62)) ** 2 for r in grid}
    keys, final = informative_seeds(grid, 3, scores)
    assert final and len(keys) == adaptive_cap(4, 3)
    extra = keys[4:]
    assert all(k[1] >= 1 for k in extra) and len(set(extra)) == 2
    # a point that failed for good gets no more seeds, and the rest still go out
    keys, final = informative_seeds(grid, 3, {k: v for k, v in scores.items() if k != (0.84, 0)},
                                    given_up={(0.84, 0)})
    assert final and (0.84, 1) not in keys and len(keys) == 6


def test_policy_names():
    assert resolve_adaptive(False) is None and resolve_adaptive(True) == "informative"
    assert resolve_adaptive("halving") == "halving"
    with pytest.raises(ConfigError, match="adaptive policy 'bisect' is not known: expected one of informative, "
                                          "halving"):
        resolve_adaptive("bisect")
    with pytest.raises(ValueError):
        adaptive_needed("bisect", [0.3, 0.5, 0.7], 2, {})



def test_the_adaptive_share():
    from race.core.errors import RaceError
    from race.run.options import RunOptions

    assert adaptive_cap(4, 3, 2 / 3) == 8 and adaptive_cap(5, 4, 0.67) == 13 and adaptive_cap(5, 4, 1.0) == 20
    assert adaptive_cap(4, 3, 0.1) == 5                      # never below one second seed
    grid = [0.45, 0.6, 0.73, 0.84]
    scores = {(r, 0): -(math.log(r) - math.log(0.62)) ** 2 for r in grid}
    keys, final = informative_seeds(grid, 3, scores, share=2 / 3)
    assert final and len(keys) == 8 and len(set(keys)) == 8
    half, _ = informative_seeds(grid, 3, scores)
    assert set(half) < set(keys)                             # greedy: a larger share only adds pilots
    keys, final = adaptive_needed("informative", grid, 3, scores, share=1.0)
    assert final and len(keys) == 12
    # halving stops where its rungs end (4 + 2 + 1 = 7 of 12), whatever the share above that
    rung = {**scores, **{(r, 1): 0.0 for r in grid}, **{(r, 2): 0.0 for r in grid}}
    assert len(successive_halving(grid, 3, rung, share=1.0)[0]) == 7
    for bad in (0, 1.5, -0.2):                               # checked once, with the run options
        with pytest.raises(RaceError, match=f"adaptive share {bad!r} is outside \\(0, 1\\]"):
            RunOptions(out_dir="x", adaptive_share=bad).check()
