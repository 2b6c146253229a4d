#!/bin/bash
# On the GPU machine (no internet), from the repository root, once every chunk folder
# .whl/vllm/c1 .. cN made by make-wheels.sh is there (see README.md for how they travel):
#     bash docs/examples/gpu-vllm/device-run.sh
# 1. reassembles the wheels and checks their sha256 against SHA256SUMS;
# 2. makes a venv /tmp/vllm-env over the machine's own environment (its torch 2.11.0 +
#    CUDA 13.0, transformers, numpy, ...) and installs the wheels there with --no-deps;
# 3. builds the tiny random-weight Llama (python -m engines.vllm.model);
# 4. starts replica-0 (bf16, GPU flags) on the GPU, waits for /health, sends one
#    /v1/completions and one streamed request;
# 5. starts replica-1 on the same GPU with the flags Ordeal's node start gives a replica
#    today (engines/vllm/nodes.py: --dtype float32 -O0, VLLM_CPU_KVCACHE_SPACE,
#    VLLM_CPU_OMP_THREADS_BIND, its own cores), then vllm-router over both, and requests
#    through the router.
# Logs and results go to $OUT (the device tool's folder) or /tmp/gpuvllm-out.
# VLLM_ENV=base installs into the machine's own environment instead of a venv.
set -u
OUT=${OUT:-/tmp/gpuvllm-out}; mkdir -p "$OUT"
W=.whl/vllm
VENV=${VENV:-/tmp/vllm-env}
MODEL=${MODEL:-/tmp/ordeal-tiny-llama}
P0=${P0:-8100}; P1=${P1:-8101}; PR=${PR:-8200}
READY_S=${READY_S:-240}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_USE_FLASHINFER_SAMPLER=0      # else FlashInfer's sampler JIT-compiles (and is not here)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
T0=$(date +%s.%N)
PIDS=""   # the servers' process groups (setsid), ended on every exit
trap 'for p in $PIDS; do kill -TERM -$p 2>/dev/null; done; sleep 2' EXIT
el() { python3 -c "import time; print(f'{time.time() - $1:.1f}')"; }
say() { echo "[$(el $T0) s] $*"; }

say "start $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv,noheader

# ---- 1. reassemble and check -------------------------------------------------------------
WH=/tmp/vllm-wheels
if [ ! -f "$WH/.ok" ]; then
    rm -rf "$WH" && mkdir -p "$WH"
    SUMS=$(ls $PWD/$W/c*/SHA256SUMS 2>/dev/null | head -1)
    [ -n "$SUMS" ] || { say "no SHA256SUMS under $W/c*/: carry c1"; ls -la $W; exit 3; }
    for f in $W/c*/*.whl; do [ -e "$f" ] && ln -s "$PWD/$f" "$WH/"; done
    for whl in $(ls $W/c*/*.part* 2>/dev/null | sed 's/\.part[0-9]*$//' | xargs -rn1 basename | sort -u); do
        cat $(ls $W/c*/"$whl".part* | awk -F/ '{print $NF" "$0}' | sort | cut -d" " -f2) > "$WH/$whl"
    done
    if ! (cd "$WH" && sha256sum --quiet -c "$SUMS"); then
        say "sha256 check failed or wheels missing (a chunk folder did not come?):"; ls $W
        exit 3
    fi
    touch "$WH/.ok"
fi
say "wheels ok: $(ls $WH/*.whl | wc -l) wheels, $(du -shL $WH | cut -f1)"
[ "${STOP_AFTER:-}" = wheels ] && exit 0

# ---- 2. environment ----------------------------------------------------------------------
if [ "${VLLM_ENV:-venv}" = base ]; then
    VPY=$(command -v python3)
else
    VPY=$VENV/bin/python
fi
if [ ! -f /tmp/vllm-installed ]; then
    if [ "$VPY" = "$VENV/bin/python" ]; then
        BASE_SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
        python3 -m venv --without-pip "$VENV" || exit 4
        VSP=$($VPY -c "import site; print(site.getsitepackages()[0])")
        # the machine's environment after the venv's own packages: its torch, CUDA libs,
        # transformers, numpy and pip are used as they are
        echo "import site; site.addsitedir('$BASE_SP')" > "$VSP/00-base-env.pth"
    fi
    t=$(date +%s.%N)
    $VPY -m pip install -q --no-index --no-deps --no-compile --ignore-installed \
        --disable-pip-version-check $WH/*.whl > $OUT/pip-install.log 2>&1 \
        || { say "pip install failed"; tail -20 $OUT/pip-install.log; exit 4; }
    say "installed into $($VPY -c 'import sys; print(sys.prefix)') in $(el $t) s"
    touch /tmp/vllm-installed
fi
$VPY -c "import torch, vllm, transformers, numpy, setuptools; print('vllm', vllm.__version__, '| torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0), '| transformers', transformers.__version__, '| numpy', numpy.__version__, '| setuptools', setuptools.__version__)" 2>&1 | tail -3
[ "${STOP_AFTER:-}" = install ] && exit 0
ROUTER=$(dirname $VPY)/vllm-router
ldd $($VPY -c "import vllm, os; print(os.path.join(os.path.dirname(vllm.__file__), '_C_stable_libtorch.abi3.so'))") 2>/dev/null | grep -E "cudart|not found" | head -5

# ---- 3. the tiny model -------------------------------------------------------------------
if [ ! -f "$MODEL/model.safetensors" ]; then
    t=$(date +%s.%N); mkdir -p "$MODEL"
    PYTHONPATH=$PWD $VPY -m engines.vllm.model --dest "$MODEL" --seed 0 --arch llama > $OUT/model.log 2>&1 \
        || { say "model build failed"; tail -20 $OUT/model.log; exit 5; }
    say "model built in $(el $t) s: $(du -sh $MODEL | cut -f1), sha256 $(sha256sum $MODEL/model.safetensors | cut -c1-16)"
fi

# ---- helpers -----------------------------------------------------------------------------
wait_health() {  # url pid log [seconds] -> 0 when /health says 200
    local url=$1 pid=$2 log=$3 limit=${4:-$READY_S} i
    for i in $(seq 1 $((limit * 2))); do
        if ! kill -0 "$pid" 2>/dev/null; then say "process $pid died; its log:"; grep -E "Error|error|No module" "$log" | tail -12; return 1; fi
        [ "$(curl -s -o /dev/null -w '%{http_code}' $url/health)" = 200 ] && return 0
        sleep 0.5
    done
    say "not ready after $limit s"; tail -15 "$log"; return 1
}
complete() {  # url node-label
    curl -s -D /tmp/h.txt $1/v1/completions -H 'content-type: application/json' \
        -d '{"model":"ordeal-tiny","prompt":"ba be bi","max_tokens":16,"temperature":0}' | head -c 600; echo
    echo "  x-ordeal-node: $(grep -i '^x-ordeal-node' /tmp/h.txt | cut -d' ' -f2 | tr -d '\r')"
}
stream() {
    curl -sN $1/v1/completions -H 'content-type: application/json' \
        -d '{"model":"ordeal-tiny","prompt":"ca ce ci","max_tokens":8,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' \
        > /tmp/stream.txt
    echo "  $(grep -c '^data: {' /tmp/stream.txt) data chunks, last: $(grep '^data:' /tmp/stream.txt | tail -1)"
    grep '^data: {' /tmp/stream.txt | tail -1 | cut -c1-300
}
gpu_mem() { nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader; }

# ---- 4. replica-0: GPU flags ------------------------------------------------------------
t=$(date +%s.%N)
ORDEAL_NODE=replica-0 PYTHONPATH=$PWD setsid $VPY -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name ordeal-tiny --host 127.0.0.1 --port $P0 \
    --max-model-len 512 --middleware engines.vllm.node_header.NodeHeaderMiddleware \
    --dtype bfloat16 --enforce-eager --gpu-memory-utilization 0.2 --disable-uvicorn-access-log \
    > $OUT/replica-0.log 2>&1 &
PID0=$!; PIDS="$PIDS $PID0"
if ! wait_health http://127.0.0.1:$P0 $PID0 $OUT/replica-0.log; then
    tail -60 $OUT/replica-0.log | cut -c1-300; exit 6
fi
say "replica-0 READY in $(el $t) s (process start to /health 200); GPU mem used, util: $(gpu_mem)"
grep -E "Using .*backend|attention backend|Model loading took|KV cache|Maximum concurrency|init engine|torch.compile|cuda graph" $OUT/replica-0.log | cut -c1-250 | head -12
t=$(date +%s.%N); complete http://127.0.0.1:$P0; say "completion in $(el $t) s"
t=$(date +%s.%N); stream http://127.0.0.1:$P0; say "stream in $(el $t) s"
[ -n "${ONE_ONLY:-}" ] && exit 0

# ---- 5. replica-1 with Ordeal's current CPU defaults, then the router -------------------
t=$(date +%s.%N)
NCORES=$(nproc); HALF=$((NCORES / 2))
ORDEAL_NODE=replica-1 PYTHONPATH=$PWD VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=$HALF \
    setsid taskset -c $HALF-$((NCORES - 1)) $VPY -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name ordeal-tiny --host 127.0.0.1 --port $P1 \
    --max-model-len 512 --middleware engines.vllm.node_header.NodeHeaderMiddleware \
    --dtype float32 --disable-uvicorn-access-log --enforce-eager -O0 \
    --gpu-memory-utilization 0.2 > $OUT/replica-1.log 2>&1 &
PID1=$!; PIDS="$PIDS $PID1"
if wait_health http://127.0.0.1:$P1 $PID1 $OUT/replica-1.log ${R1_READY_S:-150}; then
    say "replica-1 (Ordeal's flags: float32, -O0, CPU env, cores $HALF-$((NCORES - 1))) READY in $(el $t) s; GPU: $(gpu_mem)"
else
    say "replica-1 with Ordeal's CPU flags failed; again with the GPU flags"
    kill -TERM -$PID1 2>/dev/null; sleep 3; kill -KILL -$PID1 2>/dev/null
    mv $OUT/replica-1.log $OUT/replica-1-cpuflags.log; t=$(date +%s.%N)
    ORDEAL_NODE=replica-1 PYTHONPATH=$PWD setsid $VPY -m vllm.entrypoints.openai.api_server \
        --model "$MODEL" --served-model-name ordeal-tiny --host 127.0.0.1 --port $P1 \
        --max-model-len 512 --middleware engines.vllm.node_header.NodeHeaderMiddleware \
        --dtype bfloat16 --enforce-eager --gpu-memory-utilization 0.2 --disable-uvicorn-access-log \
        > $OUT/replica-1.log 2>&1 &
    PID1=$!; PIDS="$PIDS $PID1"
    wait_health http://127.0.0.1:$P1 $PID1 $OUT/replica-1.log || exit 7
    say "replica-1 (GPU flags) READY in $(el $t) s; GPU: $(gpu_mem)"
fi
grep -E "Using .*backend|attention backend|dtype|KV cache" $OUT/replica-1.log | cut -c1-250 | head -6
complete http://127.0.0.1:$P1
t=$(date +%s.%N)
setsid $ROUTER --host 127.0.0.1 --port $PR --worker-urls http://127.0.0.1:$P0 http://127.0.0.1:$P1 \
    --policy round_robin --health-check-interval-secs 1 --health-check-timeout-secs 2 \
    --cb-timeout-duration-secs 5 --log-level warning \
    --prometheus-host 127.0.0.1 --prometheus-port 29100 > $OUT/router.log 2>&1 &
PIDR=$!; PIDS="$PIDS $PIDR"
wait_health http://127.0.0.1:$PR $PIDR $OUT/router.log || { tail -20 $OUT/router.log; exit 8; }
say "router READY in $(el $t) s ($($ROUTER --version 2>/dev/null | head -1))"
for i in 1 2 3 4; do complete http://127.0.0.1:$PR | tail -1; done
t=$(date +%s.%N); stream http://127.0.0.1:$PR; say "stream through the router in $(el $t) s"
say "GPU at the end: $(gpu_mem)"
say "done"
