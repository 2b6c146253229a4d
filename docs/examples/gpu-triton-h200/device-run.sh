# one device call: setup, Triton smoke, GPU tests, the scenario run
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export ORDEAL_STATE_DIR=/tmp/ordeal-state
date
mkdir -p /tmp/site
python3 -c "import tarfile; tarfile.open('.whl/site.tar.xz').extractall('/tmp/site')" || exit 1
ln -sfn /tmp/site/nvidia_pytriton.libs /tmp/site/pytriton/tritonserver/external_libs
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/crc32c*.whl 2>&1 | tail -1
# Triton's Python backend stub embeds the system libpython3.12: it ignores the venv, so
# a .pth in the system interpreter's site dir gives it the venv's packages and /tmp/site.
VENV_SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
SYS_SP=$(/usr/bin/python3.12 -c "import site; print(site.getsitepackages()[0])" 2>/dev/null || echo /usr/local/lib/python3.12/dist-packages)
mkdir -p $SYS_SP && printf "/tmp/site\n$VENV_SP\n" > $SYS_SP/ordeal-pytriton.pth; echo "pth in $SYS_SP -> /tmp/site $VENV_SP"
printf "/tmp/site\n" > $VENV_SP/ordeal-pytriton.pth
# pytriton 0.7's stub (a pybind11 build against numpy 1) reads numpy 2 arrays as 0 bytes:
# numpy<2 for the stub process only (transformers 5 in the engine needs numpy 2).
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/stub-np1 .whl/stub/numpy-1.26.4*.whl 2>&1 | tail -1
echo "import os, sys; (sys.path.insert(0, '/tmp/stub-np1') if os.path.realpath('/proc/self/exe').endswith('triton_python_backend_stub') else None)" > $VENV_SP/00-ordeal-stub-numpy.pth
date
export PYTHONPATH=/tmp/site:$PWD
[ -z "$SKIP_SMOKE" ] && timeout 100 python3 .whl/tri_smoke.py cuda $OUT/smoke-triton.log > $OUT/smoke.out 2>&1
grep -h -E "ready|ONE|CONC|SMOKE|Error|error" $OUT/smoke.out | cut -c1-400 | head -30
date
if [ -n "$TESTS" ]; then
timeout ${TESTS_S:-150} python3 -m pytest -p no:cacheprovider $TESTS -v -s -rs > $OUT/tests.log 2>&1
grep -E "PASSED|FAILED|SKIPPED|ERROR|figures|passed|failed" $OUT/tests.log | cut -c1-700 | tail -20
date
fi
if [ -z "$SKIP_SMOKE" ] && grep -q SMOKE_OK $OUT/smoke.out; then
  timeout ${SCEN_S:-330} python3 -m runs.gpu_scenario --out /tmp/runs $SCEN_ARGS > $OUT/scenario.log 2>&1
  echo "scenario rc $?"; tail -40 $OUT/scenario.log | cut -c1-600
  tar -C /tmp/runs -czf $OUT/run.tar.gz --exclude=latest . ; ls -la $OUT
fi
date
