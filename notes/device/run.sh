#!/usr/bin/env bash
# On the lent H200, in one call: set up (wheels, peers, commit), then run each step given, in order, logging
# all of it to $OUT/device.log and packing results/, the notebooks and their images into $OUT/device.tgz.
# A step is one shell command line; these words are short for the usual ones:
#   flashmla                build FlashMLA from .peers-flashmla (about a minute) and put it on the path
#   tilelang-a, tilelang-b  install TileLang's two wheel halves (two calls to one warm machine)
#   suite                   the whole test suite, as a user with a GPU box runs it
#   triton-cache            pack this machine's Triton cache into $OUT/triton_cache.tgz; put it here as
#                           .triton-cache/cache.tgz and carry .triton-cache, and a later call (a fresh machine
#                           too) starts with it: the peers' autotuned kernels need not compile again
#   notebooks NB...         execute these chapters in place and redraw the headline figure
#                           (scripts/refresh_gpu.sh --no-tests; its log, every cell named as it starts, in $OUT)
#   reader [NB...]          strict nbval of the chapters (all, or these) as a reader runs them: the book's wheel
#                           (carried in .whl-book, built here by prepare.sh, or built there from the tree) installed
#                           alone, the notebooks and results/ copied into an empty folder, the checkout off the
#                           path; peers only where installed or carried
# To time benchmarks outside any chapter, a step `python3 scripts/gpu_probe.py TABLE...` saves their tables,
# and a chapter executed with KERNELS_BENCH=load then reads them.
# The steps share one time budget (DEVICE_BUDGET_S, default 540 s): a step that would start past it is skipped
# and named, and a running step is stopped when the budget runs out. The archive is rewritten after every
# step, so what finished comes back even when the call itself is cut off. Tables and chapters written by an
# earlier call on the same warm machine are put back before the steps run (a new machine starts clean).
# Example (the device tool's command; carry .whl .peers .peers-flashmla .device_commit):
#   bash notes/device/run.sh flashmla "python3 -m pytest -q -n 8 tests/test_mla.py" "notebooks book/mla.ipynb"
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-.}
log="$out/device.log"
start=$SECONDS
budget=${DEVICE_BUDGET_S:-540}
exec > >(tee -a "$log") 2>&1
pip_install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }

# (TileLang's first half travels alone: with it, .whl would pass one call's carry limit)
if [ -d .whl ]; then
  pip_install --upgrade --target /tmp/site .whl/*.whl \
    || { echo "device_run: the wheels in .whl did not install (run notes/device/prepare.sh here first)"; exit 2; }
fi
export PYTHONPATH="/tmp/site:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 MAMBA_SSM_PATH="$PWD/.peers/mamba_ssm"
export KERNELS_COMMIT="${KERNELS_COMMIT:-$(cat .device_commit 2>/dev/null || echo unknown)}"
# a peer that does not import gives "n/a" rows, silently: say here which ones a chapter will meet
python3 -c "from attention_kernels import peers
print('device_run: peers: fla', 'ok' if peers.fla('gla', 'chunk_gla') else 'NOT IMPORTABLE', '| mamba_ssm',
      'ok' if peers.mamba_ssm('selective_state_update', 'selective_state_update') else 'NOT IMPORTABLE')"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "device_run: commit $KERNELS_COMMIT, $(date -u '+%F %H:%M UTC')"
# Each call gets the working tree afresh, so what earlier calls on this warm machine wrote (tables, executed
# chapters) is kept outside it and put back first: a chapter can read tables timed in the call before.
keep=/tmp/device-keep
if [ -d "$keep" ]; then
  cp -r "$keep"/. . && echo "device_run: put back $(find "$keep" -type f | wc -l) files written by earlier calls"
fi
# A Triton cache an earlier call packed (`triton-cache`): fla's autotune compiled for 100-215 s a family on a
# fresh machine (notes/TUNING.md "2026-12-07 (43)"); from the cache it only times its configs
triton_cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
if [ -f .triton-cache/cache.tgz ]; then
  mkdir -p "$triton_cache" && tar xzf .triton-cache/cache.tgz -C "$triton_cache" &&
    echo "device_run: put back a carried Triton cache ($(tar tzf .triton-cache/cache.tgz | grep -c '[^/]$') files)"
fi
touch /tmp/device-call-start
keep_new() {
  find results book -maxdepth 1 -type f -newer /tmp/device-call-start 2>/dev/null | while read -r f; do
    mkdir -p "$keep/$(dirname "$f")" && cp -p "$f" "$keep/$f"
  done
}

step() {
  case "$1" in
    flashmla) bash .peers-flashmla/build.sh ;;
    tilelang-a) pip_install --target /tmp/tlsite .tl/a/*.whl ;;
    tilelang-b)
      [ -d /tmp/tlsite/tilelang ] || { echo "the machine was recycled: run tilelang-a again"; return 3; }
      pip_install --target /tmp/tlsite .tl/b/*.whl ;;
    suite) python3 -m pytest -q -n 8 tests/ -p no:cacheprovider ;;
    triton-cache)
      tar czf "$out/triton_cache.tgz" -C "$triton_cache" . &&
        echo "device_run: Triton cache packed, $(du -h "$out/triton_cache.tgz" | cut -f1) (over 16 MiB it does not come back)" ;;
    reader|reader\ *) reader ${1#reader} ;;
    notebooks\ *) OUT="$out" bash scripts/refresh_gpu.sh --no-tests ${1#notebooks } ;;
    *) bash -c "$1" ;;
  esac
}
reader() {
  rm -rf /tmp/reader /tmp/reader-dist /tmp/reader-site && mkdir -p /tmp/reader /tmp/reader-dist &&
    { cp .whl-book/*.whl /tmp/reader-dist/ 2>/dev/null ||
      python3 -m pip wheel -q --no-deps --no-build-isolation -w /tmp/reader-dist .; } &&
    pip_install --target /tmp/reader-site /tmp/reader-dist/*.whl || return 2
  local nbs=("$@"); (( ${#nbs[@]} )) || nbs=(book/*.ipynb)
  cp "${nbs[@]}" /tmp/reader/ && cp -r results /tmp/reader/
  local path="/tmp/reader-site:${PYTHONPATH//$PWD:/}"  # the checkout off the path: attention_kernels comes from the wheel
  (cd /tmp/reader && export PYTHONPATH="$path" &&
   python3 -c "import attention_kernels; assert attention_kernels.__file__.startswith('/tmp/reader-site/'), attention_kernels.__file__" &&
   python3 -m pytest -q -n "${#nbs[@]}" --dist loadfile --nbval ./*.ipynb -p no:cacheprovider)
}
export -f step pip_install reader
export out triton_cache
pack() { tar czf "$out/device.tgz" results book/*.ipynb book/images 2>/dev/null; }

[ -d .peers-flashmla/flashmla_src ] && export PYTHONPATH="$PWD/.peers-flashmla/flashmla_src:$PYTHONPATH"
status=0
for s in "$@"; do
  # TileLang's halves land in /tmp/tlsite (in this call or an earlier one on this machine): every step imports it
  [[ -d /tmp/tlsite/tilelang && ":$PYTHONPATH:" != *:/tmp/tlsite:* ]] && export PYTHONPATH="/tmp/tlsite:$PYTHONPATH"
  left=$((budget - (SECONDS - start)))
  if (( left < 10 )); then echo "device_run: SKIPPED (over ${budget}s): $s"; status=1; continue; fi
  t0=$SECONDS
  echo "=== device_run: $s"
  timeout "$left" bash -c 'step "$1"' _ "$s"; rc=$?
  (( rc == 124 )) && echo "device_run: STOPPED at the budget of ${budget}s: $s"
  echo "=== device_run: rc=$rc in $((SECONDS - t0)) s: $s"
  [ $rc = 0 ] || status=1
  keep_new
  pack
done
pack
echo "device_run: status $status after $((SECONDS - start)) s; results in $out/device.tgz"
exit $status
