#!/bin/bash
# Replay runs for `ppd sim calibrate` and benchmarks/cpu_validation.py: on a running 1P1D
# cluster behind `ppd proxy --admin-key ADMIN`, every workload x load x forced turn-2 route,
# with each node's vLLM /metrics taken before and after the run (metrics-*-NODE.txt) and the
# machine's load average (load-*.txt).
#
#   PROXY=http://127.0.0.1:8000 PREFILL=http://127.0.0.1:8100 DECODE=http://127.0.0.1:8101 \
#   OUT=runs/cpu WORKLOADS="small-mid_bal small-big_paste small-short_gen" RATES="0.5 1 1.5" \
#   scripts/calibration_runs.sh
set -u
PROXY=${PROXY:-http://127.0.0.1:8000}
PREFILL=${PREFILL:-http://127.0.0.1:8100}
DECODE=${DECODE:-http://127.0.0.1:8101}
OUT=${OUT:-runs/cpu}
TOKENIZER=${TOKENIZER:-$HOME/.cache/ppd/models/tiny}
for wl in ${WORKLOADS:-small-mid_bal small-big_paste small-short_gen}; do
  for rate in ${RATES:-0.5 1 1.5}; do
    for route in local pd; do
      d=$OUT/$wl@$rate-$route
      [ -f "$d/summary.json" ] && continue
      mkdir -p "$d"
      curl -sf "$PREFILL/metrics" > "$d/metrics-before-prefill.txt"
      curl -sf "$DECODE/metrics" > "$d/metrics-before-decode.txt"
      uptime > "$d/load-before.txt"
      ppd replay --target "$PROXY" --dataset "synthetic:$wl" --conversation-rate "$rate" \
        --duration "${DURATION:-20}" --max-turns 2 --force-route "$route" --admin-key ADMIN \
        --tokenizer "$TOKENIZER" --seed "${SEED:-1}" --out "$d" --force --no-progress \
        --timeout 60 > "$d/replay.log" 2>&1 || echo "replay failed: $d/replay.log"
      curl -sf "$PREFILL/metrics" > "$d/metrics-after-prefill.txt"
      curl -sf "$DECODE/metrics" > "$d/metrics-after-decode.txt"
      uptime > "$d/load-after.txt"
      echo "$(date +%T) $d"
    done
  done
done
