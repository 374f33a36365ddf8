#!/usr/bin/env bash
# Mutation testing of the core modules with mutmut. Not part of the default test run.
#
#   pip install -e ".[test,mutation]"      # mutmut==3.8.1
#   [PYTHON=mutmut-venv/bin/python BUILD_PYTHON=.venv/bin/python] benchmarks/mutation/run.sh [MUTANT_PATTERN ...]   # e.g. "gms_kernels.core.schedule.*"; none: every core module
#
# The run happens in a detached git worktree of HEAD (a frozen snapshot: the checkout can change meanwhile),
# with the C++ extension built there. mutmut copies gms_kernels/ and tests/ into <worktree>/mutants/ and puts
# that folder first on sys.path, so the tests import the mutated copy, not an editable install elsewhere.
# Settings (modules, test files, the one exclusion) are in pyproject.toml [tool.mutmut].
# Then: cd <worktree> && python <repo>/benchmarks/mutation/report.py --diffs  (counts and survivors)
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel)
WORK=${MUTATION_WORKTREE:-/tmp/gms-mutation}
PY=${PYTHON:-python}
# the extension is built with the project's own Python (mutmut's venv may lack a setuptools that reads pyproject.toml)
BUILD_PY=${BUILD_PYTHON:-$PY}
if [ ! -d "$WORK" ]; then
    git -C "$ROOT" worktree add --detach "$WORK" HEAD
fi
cd "$WORK"
echo "measuring commit $(git rev-parse HEAD) in $WORK with mutmut $("$PY" -c 'import importlib.metadata as m; print(m.version("mutmut"))')"
"$BUILD_PY" setup.py build_ext --inplace >/dev/null
mkdir -p mutants/benchmarks mutants/csrc  # also_copy copies benchmarks/reference_loop.py and csrc/step_api.h there
# one worker, one thread per test process: the machine is shared
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
if [ $# -eq 0 ]; then
    set -- "gms_kernels.core.schedule.*" "gms_kernels.core.moments.*" "gms_kernels.core.mixture.*" "gms_kernels.core.fit.*" \
           "gms_kernels.solvers.*" "gms_kernels.integrations.scheduler.*" "gms_kernels.sampling.*" "gms_kernels.models.*" \
           "gms_kernels.eval.tuning.*" "gms_kernels.eval.metrics.*"
fi
nice -n 10 "$PY" -m mutmut run --max-children 1 "$@"
"$PY" "$ROOT/benchmarks/mutation/report.py" --diffs
