#!/usr/bin/env bash
# Run the README's quick start top to bottom, as written, in a scratch directory.
#
# The commands are read from README.md, between the markers `<!-- readme-check:start -->` and
# `<!-- readme-check:end -->`, so the README cannot drift from what is checked. Stand-ins,
# and only these, keep the check CPU-cheap (< 60 s, no vLLM):
#   - `make install`, `. .venv/bin/activate`: skipped; `ppd` runs this checkout's code with
#     $PYTHON (default: .venv/bin/python of this checkout);
#   - `ppd model prepare`, `ppd cluster up`, `ppd cluster down`: replaced by a fake 1P1D
#     cluster (tests/fakes/readme_cluster.py) that writes .ppd-cluster/cluster.json;
#   - the proxy port 8000 becomes a free port, and every `--duration N` becomes
#     `--duration $READMECHECK_DURATION` (default 2 s: the fakes answer in milliseconds).
# Everything else (proxy, replay, profile, table, report, curl) runs exactly as written.
# Exit status 0 iff every command succeeded and the outputs the README names exist.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
DURATION=${READMECHECK_DURATION:-2}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ppd-readme.XXXXXX")

cleanup() {
    local pids
    pids=$(jobs -p)
    [ -n "$pids" ] && kill $pids 2>/dev/null || true
    wait 2>/dev/null || true
    [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

command -v curl > /dev/null || { echo "readme_check: the quick start needs curl" >&2; exit 1; }
cd "$WORK"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
mkdir bin
printf '#!/bin/sh\nexec "%s" -m profiler.cli "$@"\n' "$PYTHON" > bin/ppd
chmod +x bin/ppd
export PATH="$WORK/bin:$PATH"

PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# The commands: the README's block, code fences dropped, stand-ins applied.
awk '/<!-- readme-check:start -->/{on=1; next} /<!-- readme-check:end -->/{on=0} on' \
    "$REPO/README.md" | grep -v '^```' | sed -E \
    -e 's/^(make install|\. \.venv\/bin\/activate|ppd model prepare|ppd cluster (up|down))/# [stand-in] &/' \
    -e "s/127\.0\.0\.1:8000/127.0.0.1:$PORT/g" \
    -e "s/--port 8000/--port $PORT/g" \
    -e "s/--duration [0-9.]+/--duration $DURATION/g" > steps.sh
if ! grep -q '^ppd ' steps.sh; then
    echo "readme_check: no commands between the readme-check markers of README.md" >&2
    exit 1
fi

"$PYTHON" -m tests.fakes.readme_cluster --state .ppd-cluster --model tiny &
for _ in $(seq 100); do [ -f .ppd-cluster/cluster.json ] && break; sleep 0.1; done
[ -f .ppd-cluster/cluster.json ] || { echo "readme_check: the fake cluster did not start" >&2; exit 1; }

echo "readme_check: running $(grep -c '^ppd\|^curl' steps.sh) commands from README.md in $WORK"
set -x
# shellcheck disable=SC1091
source steps.sh
set +x

# Every file the quick start says it writes.
for path in runs/pd@1/summary.json runs/pd@1/requests.csv runs/pd@1/ttft_cdf.png \
            runs/ppd@1/summary.json runs/mine.csv runs/mine.parquet runs/mine.meta.json \
            runs/mine.small.png runs/compare/compare.csv; do
    [ -s "$path" ] || { echo "readme_check: $path is missing" >&2; exit 1; }
done
echo "readme_check: OK"
