#!/usr/bin/env bash
# Run ONCE, by the coordinator, after the branches of issues 19, 21 and 22 have merged:
# deletes the TEMPORARY format exclusions of pyproject.toml, ruff-formats the whole tree,
# regenerates the notebooks' .ipynb twins from their reformatted .py sources, and checks
# that lint, format and the doctests/notebook pairing still pass. Then commit the result
# as one commit ("ruff format the tree") so `git blame --ignore-rev` can skip it.
set -euo pipefail
cd "$(dirname "$0")/.."
python - <<'PY'
import re
from pathlib import Path
p = Path("pyproject.toml")
s = p.read_text()
s2 = re.sub(r"\n    # BEGIN TEMPORARY format exclusions:.*?# END TEMPORARY format exclusions\n", "\n", s, flags=re.S)
assert s2 != s, "no TEMPORARY format exclusions left in pyproject.toml"
p.write_text(s2)
PY
ruff format src tests benchmarks notebooks docs
python notebooks/run_all.py --sync
ruff check .
ruff format --check .
python -m pytest -q tests/test_notebooks.py tests/test_doctests.py tests/test_readme.py
echo "formatted; review 'git diff --stat' and commit"
