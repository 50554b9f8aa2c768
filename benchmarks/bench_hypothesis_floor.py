"""What hypothesis itself costs per example and per choice, the floor under every fuzz property.

    python benchmarks/bench_hypothesis_floor.py [--examples 2000]

CPU time per example (``time.process_time``) of bare ``@given`` tests that draw
``k`` integers and do nothing else: inside one composite, and as ``k``
``data.draw`` calls at the test's level; the slope between ``k = 1`` and
``k = 50`` is the cost of one further choice. docs/robustness.md quotes it.
"""

from __future__ import annotations

import argparse
import time

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

INTEGERS = st.integers(0, 2**32 - 1)


def per_example(test, n: int) -> float:
    test()  # the first run builds the strategies
    t = time.process_time()
    test()
    return (time.process_time() - t) / n * 1e3


def tests(quick, k: int):
    """The two bare tests drawing ``k`` integers: in one composite, and ``k`` data.draw calls."""

    @st.composite
    def draws(draw):
        return [draw(INTEGERS) for _ in range(k)]

    composite = draws()

    @quick
    @given(st.data())
    def in_composite(data):
        data.draw(composite)

    @quick
    @given(st.data())
    def at_test_level(data):
        for _ in range(k):
            data.draw(INTEGERS)

    return in_composite, at_test_level


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000)
    n = ap.parse_args().examples
    quick = settings(
        max_examples=n, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
    )
    rows = {}
    for k in (1, 10, 50):
        in_composite, at_test_level = tests(quick, k)
        rows[k] = (per_example(in_composite, n), per_example(at_test_level, n))
    print("| integers drawn | CPU ms / example, in one composite | CPU ms / example, data.draw each |")
    print("|---|---|---|")
    for k, (a, b) in rows.items():
        print(f"| {k} | {a:.3f} | {b:.3f} |")
    (a1, b1), (a50, b50) = rows[1], rows[50]
    print(
        f"\none more choice: {(a50 - a1) / 49 * 1e3:.0f} us in a composite, {(b50 - b1) / 49 * 1e3:.0f} us as a data.draw"
    )


if __name__ == "__main__":
    main()
