#!/usr/bin/env bash
# Run the README's train command N times in a row (default 30) and count the runs that failed:
# a non-zero exit, or an abort message after training. Writes results.txt next to this script.
#   bash benchmarks/stress/run.sh [N]
set -uo pipefail
cd "$(dirname "$0")/../.."
runs="${1:-30}"
failed=0
log="$(mktemp)"
for i in $(seq 1 "$runs"); do
    if ! .venv/bin/graphpipe train --model mmt --preset tiny --nproc 4 --steps 50 >"$log" 2>&1 \
            || grep -qE "terminate called|Aborted|SIGABRT" "$log"; then
        failed=$((failed + 1))
        echo "run $i failed:"; tail -5 "$log"
    fi
done
rm -f "$log"
summary="$(date -u +%F): $runs runs of 'graphpipe train --model mmt --preset tiny --nproc 4 --steps 50', $failed failed"
echo "$summary" | tee benchmarks/stress/results.txt
