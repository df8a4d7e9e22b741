#!/usr/bin/env bash
# Three consecutive fresh-clone CI runs under load (issue 39): a busy Python loop on each core
# beside `CI=true bash .ci/run` on a fresh clone of the repository; stops at the first failure.
# Usage: bash tools/loaded-ci.sh [RUNS] [LOGDIR]   (default 3 runs, logs in ./loaded-ci-logs)
set -u
repo="$(cd "$(dirname "$0")/.." && pwd)"
runs="${1:-3}"
logs="${2:-$repo/loaded-ci-logs}"
mkdir -p "$logs"
hogs=()
for _ in $(seq "$(nproc)"); do python3 -c "while True: pass" & hogs+=($!); done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
for i in $(seq "$runs"); do
  clone="$(mktemp -d)"
  git clone -q "$repo" "$clone"
  commit="$(git -C "$clone" rev-parse --short HEAD)"
  start=$(date +%s)
  (cd "$clone" && CI=true bash .ci/run) > "$logs/run$i.log" 2>&1
  rc=$?
  result="$(grep -E "passed|failed" "$logs/run$i.log" | tail -1)"
  echo "run $i commit $commit rc=$rc wall=$(( $(date +%s) - start ))s :: $result" | tee -a "$logs/summary.log"
  rm -rf "$clone"
  [ "$rc" -eq 0 ] || exit 1
done
