#!/usr/bin/env bash
# Here, before a run on the lent H200: fill the ignored folders a device call carries.
#   .whl             the Jupyter stack and fla, as wheels for the GPU box's Python 3.12
#   .peers           mamba_ssm's Triton ops (MAMBA_SSM_PATH points at .peers/mamba_ssm, the folder holding the package)
#   .peers-flashmla  FlashMLA's source, built there by notes/device/run.sh flashmla
#   .whl-book        the book's own wheel, built from the tree (run.sh's `reader` step installs it alone)
#   .tl/a, .tl/b     TileLang's wheels, in two halves (one call can carry only one)
#   .device_commit   the commit the results will name (the GPU box gets no .git)
# Usage, from the repository root, with the project's shared folder beside it:
#   bash notes/device/prepare.sh [--tilelang]
# Then carry [".whl", ".whl-book", ".peers", ".peers-flashmla", ".device_commit"] (or .tl/a, .tl/b for TileLang's
# calls).
set -euo pipefail
cd "$(dirname "$0")/../.."
shared=${SHARED:-../shared}
for ignored in /.whl/ /.whl-book/ /.peers/ /.peers-flashmla/ /.tl/ /.triton-cache/ /.device_commit; do
  grep -qxF "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
[ -d .whl ] && [ "$(ls .whl | wc -l)" -gt 30 ] || bash "$shared/gpu/wheels.sh"
[ -d .peers/mamba_ssm ] || { mkdir -p .peers && cp -r "$shared/peers/mamba_ssm" .peers/; }
# mamba_ssm's Mamba2 block for tests/test_peer_layers.py: modules/mamba2.py and distributed/ of the ops' commit,
# taken from a mirror of state-spaces/mamba where this machine has one (the tool library's `fetch`,
# github:state-spaces/mamba); without it those tests skip, saying so
mamba_commit=e9594ce1c732d97440f0332fdc43170a2294dbfa
mamba_mirror=${MAMBA_MIRROR:-/work/.mirror/state-spaces+mamba/repo}
if [ ! -f .peers/mamba_ssm/mamba_ssm/modules/mamba2.py ] && git --git-dir="$mamba_mirror" cat-file -e "$mamba_commit" 2>/dev/null; then
  chmod -R u+w .peers/mamba_ssm
  git --git-dir="$mamba_mirror" archive "$mamba_commit" mamba_ssm/modules/__init__.py mamba_ssm/modules/mamba2.py \
    mamba_ssm/distributed | tar -x -C .peers/mamba_ssm
fi
[ -d .peers-flashmla ] || cp -r "$shared/peers/flashmla" .peers-flashmla
if [ "${1:-}" = --tilelang ] && [ ! -d .tl/b ]; then bash "$shared/gpu/tilelang.sh"; fi
rm -rf .whl-book && python3 -m pip wheel -q --no-deps -w .whl-book . 2>&1 | grep -v '^WARNING' || true
rm -rf build ./*.egg-info  # what building the wheel leaves in the tree
git rev-parse --short HEAD > .device_commit
if git status --short --untracked-files=no | grep -q .; then
  echo "note: uncommitted changes; the results will name $(cat .device_commit) all the same"
fi
du -sch .whl .peers .peers-flashmla | tail -1 | xargs echo "to carry:"
