"""engine.resources.cache_budget: when compilation caches are worth dropping (issue 37).

The rule is fed resident-size readings, so these tests drive it with numbers; the kernel
test (tests/kernel/test_cache_reset.py) drives it with real compiles.
"""

from __future__ import annotations

from shardlab.engine.resources.cache_budget import MIN_SHARE, CacheBudget, default_budget

MiB = 2**20
GiB = 2**30


def test_many_programs_under_the_budget_never_wipe():
    # 600 cells of ~26 small programs each, 1 MiB apiece: 15,600 programs, far beyond the
    # old limit of 256, but 15 GiB of growth only with a budget of 16 GiB.
    budget = CacheBudget()
    rss = 300 * MiB
    budget.observe(rss, programs=0)
    wipes = 0
    for cell in range(600):
        rss += 26 * MiB
        budget.observe(rss, programs=26 * (cell + 1))
        wipes += budget.over(16 * GiB)
    assert wipes == 0
    assert budget.held() == 600 * 26 * MiB


def test_growth_over_the_budget_is_due_and_a_wipe_resets_the_floor():
    budget = CacheBudget()
    budget.observe(300 * MiB, programs=10)
    budget.observe(700 * MiB, programs=400)
    assert budget.held() == 400 * MiB
    assert not budget.over(512 * MiB)
    budget.observe(900 * MiB, programs=600)
    assert budget.over(512 * MiB)
    freed = budget.wiped(900 * MiB, 320 * MiB)
    assert freed == 580 * MiB and budget.floor == 320 * MiB
    assert budget.share > 0.95  # freed nearly all of the growth: the caches held it
    budget.observe(330 * MiB, programs=5)
    assert budget.held() <= 10 * MiB and not budget.over(512 * MiB)


def test_a_wipe_that_freed_little_makes_the_next_wait_for_more_growth():
    # The user's data grew, not the caches: the wipe freed 10% of the growth.
    budget = CacheBudget()
    budget.observe(300 * MiB, programs=1)
    budget.observe(900 * MiB, programs=20)
    assert budget.over(512 * MiB)
    budget.wiped(900 * MiB, 840 * MiB)
    assert budget.share == MIN_SHARE
    budget.observe(840 * MiB + 600 * MiB, programs=10)
    assert not budget.over(512 * MiB)  # 600 MiB of growth counts as 300
    budget.observe(840 * MiB + 1100 * MiB, programs=20)
    assert budget.over(512 * MiB)  # bounded: at most 1 / MIN_SHARE times the budget
    budget.wiped(1940 * MiB, 900 * MiB)  # this one freed most of the growth again
    assert budget.share > 0.9


def test_memory_freed_by_the_user_lowers_the_floor():
    budget = CacheBudget()
    budget.observe(2 * GiB, programs=1)
    budget.observe(1 * GiB, programs=2)  # a large array deleted
    budget.observe(1 * GiB + 600 * MiB, programs=300)
    assert budget.held() == 600 * MiB and budget.over(512 * MiB)


def test_caches_emptied_elsewhere_start_a_new_floor():
    # %release, %devices or jax.clear_caches() emptied the caches: fewer programs than before
    budget = CacheBudget()
    budget.observe(300 * MiB, programs=1)
    budget.observe(800 * MiB, programs=500)
    budget.observe(820 * MiB, programs=3)
    assert budget.floor == 820 * MiB and budget.held() == 0


def test_default_budget_is_an_eighth_of_the_host_at_least_a_gib():
    assert default_budget(64 * GiB) == 8 * GiB
    assert default_budget(4 * GiB) == 1 * GiB
    assert default_budget(0) == 2 * GiB  # unknown host
    assert default_budget() >= 1 * GiB
