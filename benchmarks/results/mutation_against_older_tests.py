"""Run some mutants of benchmarks/mutants.py against the tests of an older tree: commit 7a669bb, before issue 24.

git archive 7a669bb | tar -x -C /tmp/t24/old
nice -n 10 python benchmarks/results/mutation_against_older_tests.py
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
import mutation as m
from mutants import CATALOGUE

old = {  # the pre-issue tests that own each behaviour
    "budget_fits_strict": "tests/test_budget.py",
    "metrics_output_nmse_axis": "tests/test_metrics.py tests/test_compare_kernels.py",
    "metrics_output_p90": "tests/test_metrics.py",
    "metrics_output_cosine_pooled": "tests/test_metrics.py",
    "strategies_inverse_overflow_range": "tests/test_strategies.py",
    "strategies_no_rotated_one_hot": "tests/test_strategies.py",
    "strategies_min_ties_off_tie": "tests/test_strategies.py",
    "numcodecs_max_ndim": "tests/test_numcodecs.py",
    "dask_partial_step_dropped": "tests/test_dask.py",
    "cli_interrupt_status": "tests/test_cli_robustness.py tests/test_cli_compare.py",
    "codecs_threaded_error_order": "tests/test_api.py tests/test_errors.py",
    "kernel_f16_tie_to_odd": "tests/test_format_f16.py tests/test_format_q4_1.py tests/test_format_q5.py",
}
rows = []
for mu in CATALOGUE:
    if mu.name in old:
        mu2 = type(mu)(mu.name, mu.package, mu.file, mu.old, mu.new, tuple(old[mu.name].split()), mu.why)
        r = m.run_mutant(mu2, Path("/tmp/t24/old"), 900)
        r.pop("output", None)
        print(r["name"], r["result"], r["seconds"], r.get("caught_by", ""), flush=True)
        rows.append(r)
Path(__file__).with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
