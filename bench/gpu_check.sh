#!/usr/bin/env bash
# The GPU checks owed on a lent GPU machine, in one call, read-only on the card: nothing here sets a
# clock, power limit, persistence, ECC, compute mode or MIG, and the agent runs with tuning off (the
# retune below is a dry run, which the agent answers with its plan). The card's settings are
# printed before and after, and the script exits 1 if any of them differs.
#
#   bench/gpu_check.sh OUTDIR     (PYTHON=... for another interpreter; default python3)
#
# Writes to OUTDIR: env.txt (machine, card settings before/after), agent_once.json
# (`gpufleet agent --once --json` on real NVML), gpu_tests.txt (the gpu-marked tests),
# agent_collect.txt + its JSON (bench/agent_collect.py --source nvml), probe_quality.txt + its JSON,
# and node_e2e.txt: a controller and a real-NVML agent on loopback, the on-connect probes on the GPU,
# then what an operator sees (nodes, node, findings, probe-node, retune --dry-run), and
# gpm_intervals.txt: how often each GPM metric reads empty by the time between reads, idle and under
# a memory-bound load (bench/gpm_intervals.py).
set -u
out=${1:?usage: bench/gpu_check.sh OUTDIR}
py=${PYTHON:-python3}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1

settings() {
    nvidia-smi --query-gpu=index,persistence_mode,power.limit,power.default_limit,compute_mode,ecc.mode.current,ecc.mode.pending,clocks_event_reasons.applications_clocks_setting,mig.mode.current --format=csv
}
gpufleet() { timeout 120 "$py" -m controller "$@"; }

{
    echo "# $(date -u +%FT%TZ) $(uname -srm) nproc $(nproc) main at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=name,driver_version,vbios_version,memory.total --format=csv
    "$py" - <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

import torch

try:
    nvml = version("nvidia-ml-py")
except PackageNotFoundError:
    nvml = "not installed"
print(sys.version.split()[0], "torch", torch.__version__, "nvidia-ml-py", nvml)
PY
    echo "## settings before"
    settings
} >"$out/env.txt" 2>&1
settings >/tmp/gpu_check.before 2>&1

echo "== agent --once --json"
SECONDS=0
gpufleet agent --once --json >"$out/agent_once.json" 2>/tmp/gpu_check.once.err
echo "rc=$? in ${SECONDS}s"; tail -3 /tmp/gpu_check.once.err

echo "== gpu tests"
timeout 240 "$py" -m pytest -p no:cacheprovider -m gpu -rA -q --timeout 120 \
    tests/agent/probes/test_copies.py tests/agent/probes/test_nccl_gloo.py tests/agent/probes/test_gemm.py \
    tests/agent/probes/test_runner.py tests/agent/sources/test_nvml.py tests/agent/sources/test_nvml_smi.py \
    >"$out/gpu_tests.txt" 2>&1
echo "rc=$?"; tail -4 "$out/gpu_tests.txt"

echo "== agent_collect"
timeout 120 "$py" bench/agent_collect.py --source nvml --cycles 100 --save "$out" >"$out/agent_collect.txt" 2>&1
echo "rc=$?"

echo "== probe_quality"
timeout 200 "$py" bench/probe_quality.py --save "$out" >"$out/probe_quality.txt" 2>&1
echo "rc=$?"; cat "$out/probe_quality.txt"

echo "== node e2e"
timeout 200 bash bench/gpu_node_e2e.sh "$py" >"$out/node_e2e.txt" 2>&1
echo "rc=$?"

echo "== gpm intervals"
for load in none copy; do
    timeout 70 "$py" bench/gpm_intervals.py --load "$load" --intervals 0.03,0.5,2,5 --reads 5
    echo "rc=$?"
done >"$out/gpm_intervals.txt" 2>&1
grep -E "dram|rc=" "$out/gpm_intervals.txt"

echo "## settings after" >>"$out/env.txt"
settings >>"$out/env.txt" 2>&1
if settings | diff /tmp/gpu_check.before - >/dev/null; then
    echo "card settings unchanged" | tee -a "$out/env.txt"
else
    echo "CARD SETTINGS CHANGED" | tee -a "$out/env.txt"
    exit 1
fi
