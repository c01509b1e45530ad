#!/usr/bin/env bash
# Refresh everything the site shows, on a GPU (the project's H200):
#   the whole test suite -> execute chapter notebooks in place (they time and write results/) ->
#   headline figure -> one archive of notebooks, results and figures.
# Usage, from the repository root:
#   bash scripts/refresh_gpu.sh                           # whole suite, then every chapter
#   bash scripts/refresh_gpu.sh book/gla.ipynb            # whole suite, then just these notebooks
#   bash scripts/refresh_gpu.sh --no-tests book/mla.ipynb # notebooks only
#   bash scripts/refresh_gpu.sh --tests-only              # the suite only
# The suite is `pytest tests/`, all of it, as a user with a GPU box would run it: the GPU-marked tests
# and every CPU test too (the site checks skip themselves where the book's toolchain is not installed).
# The archive goes to $OUT/gpu_refresh.tgz if OUT is set, else ./gpu_refresh.tgz: unpack it at
# the repository root and commit. On a copy of the tree without .git, set KERNELS_COMMIT to
# the commit it was taken from, so the results name it.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"  # `import attention_kernels` from book/ too
export KERNELS_COMMIT="${KERNELS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
out="${OUT:-.}"
run_tests=1 run_notebooks=1
case "${1:-}" in
  --no-tests) run_tests=0; shift ;;
  --tests-only) run_notebooks=0; shift ;;
esac
python3 -c 'import torch; assert torch.cuda.is_available(), "refresh_gpu.sh needs a CUDA GPU"' || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv

status=0
if [ $run_tests = 1 ]; then
  python3 -m pytest -q tests/ -p no:cacheprovider --durations=10 2>&1 | tee "$out/tests.log" | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ $run_notebooks = 1 ]; then
  python3 scripts/execute_notebooks.py "$@" 2>&1 | tee "$out/notebooks.log" | grep -v ': cell '
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  python3 scripts/make_figures.py || status=1
  tar czf "$out/gpu_refresh.tgz" book/*.ipynb book/images results
  echo "refresh_gpu.sh: archive $out/gpu_refresh.tgz"
fi
echo "refresh_gpu.sh: status $status"
exit $status
