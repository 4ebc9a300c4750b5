#!/usr/bin/env bash
# One real GPU node end to end on loopback (run by bench/gpu_check.sh): a controller (SQLite in a
# temp dir, plaintext on 127.0.0.1) and an agent reading real NVML with tuning off; waits for the
# on-connect probes to land, then prints what an operator sees. Read-only on the card: the retune is
# a dry run. Usage: bench/gpu_node_e2e.sh [PYTHON] (SOURCE=sim: the same path on the simulator)
set -u
py=${1:-python3}
node=gpu-e2e
tmp=$(mktemp -d)
gpufleet() { timeout 150 "$py" -m controller "$@"; }
cleanup() {
    kill "$agent" "$controller" 2>/dev/null
    wait 2>/dev/null
    echo "== agent log (last 80 lines)"; tail -80 "$tmp/agent.log"
    echo "== controller log (last 30 lines)"; tail -30 "$tmp/controller.log"
    rm -rf "$tmp"
}
trap cleanup EXIT

cat >"$tmp/controller.yaml" <<EOF
listen: 127.0.0.1:0
metrics_address: null
db: $tmp/gpufleet.db
EOF
"$py" -m controller controller --config "$tmp/controller.yaml" --ready-file "$tmp/ready" >"$tmp/controller.log" 2>&1 &
controller=$!
for _ in $(seq 300); do [ -s "$tmp/ready" ] && break; sleep 0.1; done
address=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' "$tmp/ready") || exit 1
echo "controller at $address"

cat >"$tmp/agent.yaml" <<EOF
node: $node
source: ${SOURCE:-nvml}
interval_seconds: 2
stream: {controller: "$address", spool_dir: "$tmp/spool"}
metrics: {address: null}
EOF
SECONDS=0
"$py" -m controller agent --config "$tmp/agent.yaml" >"$tmp/agent.log" 2>&1 &
agent=$!
round_done() {  # the on-connect probe command has finished (its results are stored with it)
    gpufleet commands --node "$node" --controller "$address" -o json 2>/dev/null | "$py" -c '
import json, sys
body = json.load(sys.stdin)
states = [c["state"] for c in (body["commands"] if isinstance(body, dict) else body)]
sys.exit(0 if states and all(s in ("succeeded", "failed", "timed_out", "cancelled") for s in states) else 1)' 2>/dev/null
}
until round_done; do
    if [ "$SECONDS" -gt 150 ] || ! kill -0 "$agent" 2>/dev/null; then
        echo "the on-connect probe round of $node did not finish in ${SECONDS}s"; exit 1
    fi
    sleep 1
done
echo "on-connect probe round finished ${SECONDS}s after the agent started"
failed=0
for args in "nodes -o wide" "node $node" "findings --all" "probe-node $node --probe gemm" \
    "retune $node --profile gpu-defaults --dry-run --yes" "commands --node $node"; do
    echo "== gpufleet $args"
    # shellcheck disable=SC2086
    gpufleet $args --controller "$address"
    rc=$?
    echo "(rc=$rc)"
    [ "$rc" -eq 0 ] || failed=1
done
exit "$failed"
