#!/usr/bin/env bash
# One lent GPU window in one command of at most 10 minutes: one campaign chunk of the runs named, at once, and beside
# them, in the background, the GPU kit's CUDA tests that TESTS selects (those still to pass). A window of 15 minutes,
# the machine's start included, holds one such command and not two: the tests take a few of the 16 cores and a little
# of the GPU, so that window's paces are lower for them (say so where they are quoted).
#
#   TESTS="cuda and separate" bash benchmarks/window.sh OUT starpilot__ppo_procgen__1 bossfight__ppo_procgen__1
#
# OUT gets what comes back (at most 8 files): each run's new parts, `window.tgz` (the report and the kit's GPU.md with
# its logs) and the two consoles. BUDGET (480 s) is the campaign's; STATE, PLAN and WORK are where the state, the plan
# and the runs unpacked are (learning.py's defaults); CAMPAIGN_FLAGS are more of the campaign's options; QUICK=1 runs
# the tests as the kit's quick mode does, on the CPU (a rehearsal).
# The packages are installed before it; afterwards each run's parts replace its parts in the state folder here.
set -euo pipefail
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift
cd "$(dirname "$0")/.."
state=${STATE:-benchmarks/campaign/state}
kit=""
if [ -n "${TESTS:-}" ]; then # the kit's test step alone, killed past its own limit, on 2 workers (not one a core)
    PYTEST_ADDOPTS="${PYTEST_ADDOPTS:--n 2}" "${PYTHON:-python}" benchmarks/gpu.py ${QUICK:+--quick} --out "$out/kit" --skip "Speed options" "Machine full" \
        --tests "$TESTS" --timeout "${TESTS_TIMEOUT:-240}" >"$out/kit_console.txt" 2>&1 &
    kit=$!
fi
status=0
"${PYTHON:-python}" benchmarks/learning.py campaign --budget "${BUDGET:-480}" --parallel "$#" --state "$state" \
    --plan "${PLAN:-benchmarks/campaign/plan.json}" ${WORK:+--work "$WORK"} --report "$out/report" \
    ${CAMPAIGN_FLAGS:-} --only "$@" \
    >"$out/campaign_console.txt" 2>&1 || status=$?
if [ -n "$kit" ]; then
    wait "$kit" || echo "the kit's tests: exit status $?" >>"$out/kit_console.txt"
fi
tar -czf "$out/window.tgz" -C "$out" $(cd "$out" && ls -d report kit 2>/dev/null)
rm -rf "$out/report" "$out/kit"
for key in "$@"; do
    cp "$state/$key".tar.xz.* "$out/" 2>/dev/null || echo "window: $key left no parts" >>"$out/campaign_console.txt"
done
tail -n 5 "$out/campaign_console.txt"
exit "$status"
