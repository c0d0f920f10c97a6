"""Verifier workers that die (not time out): one retry, then a counted 0.

Issue 39, item 4: a worker killed by the OOM killer or a native crash used
to score its item 0 with nothing counting it. The pool's test hook makes a
worker exit on chosen answers a chosen number of times, so the deaths are
deterministic.
"""

from ada_jax.verifier import pool


def _run(tmp_path, crash: dict[str, int]):
  items = [str(k) for k in range(1, 13)]
  p = pool._Pool(2, crash=(str(tmp_path), crash))
  try:
    tasks = [(k, a, a) for k, a in enumerate(items)]
    return p.run(tasks, len(items), timeout_s=30.0)
  finally:
    p.close()


def test_a_worker_that_dies_once_costs_no_reward(tmp_path):
  # Items 3, 5 and 8 kill their first worker; each retry on a fresh one
  # scores them 1 as the correct answers they are.
  results, stats = _run(tmp_path, {'3': 1, '5': 1, '8': 1})
  assert results == [True] * 12
  assert stats.get('worker_deaths', 0) == 0
  assert stats['calls'] == 12
  assert len(list(tmp_path.iterdir())) == 3  # three workers did die


def test_an_item_whose_retry_dies_too_scores_0_and_is_counted(tmp_path):
  results, stats = _run(tmp_path, {'4': 2, '9': 1})
  assert results == [k != 4 for k in range(1, 13)]
  assert stats['worker_deaths'] == 1
  assert stats['calls'] == 12
