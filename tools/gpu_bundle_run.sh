#!/usr/bin/env bash
# A device bundle's one command (copied into it as run.sh by tools/gpu_bundle.py; docs/gpu.md): install the
# bundle's wheels into a temporary target with --no-index, then run the GPU check with this machine's python3
# (MESHSERVE_GPU_PYTHON to use another), writing report.md, figures.json and the logs under $OUT, or under the
# folder given as the first argument. Further arguments go to `python -m tests.gpu.check`.
set -uo pipefail
bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$bundle")"
python="${MESHSERVE_GPU_PYTHON:-python3}"
out="${1:-${OUT:-$repo/bench/results/gpu-check}}"
[ $# -gt 0 ] && shift
mkdir -p "$out"
out="$(cd "$out" && pwd)"
site="$(mktemp -d "${TMPDIR:-/tmp}/meshserve-gpu-site.XXXXXX")"
trap 'rm -rf "$site"' EXIT
export PYTHONUNBUFFERED=1
cd "$repo" || exit 1
{
  echo "bundle: $bundle ($(du -sh "$bundle" | cut -f1)), python: $(command -v "$python")"
  "$python" tools/gpu_bundle_install.py "$bundle" "$site/lib" --report "$site/install.json" &&
    PYTHONPATH="$site/lib:$repo${PYTHONPATH:+:$PYTHONPATH}" "$python" -m tests.gpu.check \
      --bundle "$bundle" --out "$out" --install-report "$site/install.json" "$@"
} 2>&1 | tee "$out/check.log"
exit "${PIPESTATUS[0]}"
