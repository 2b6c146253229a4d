# How .whl/ (what device-run.sh installs on a machine without internet) was made,
# on the machine with pip access, in the repository root. 64 MiB may travel with a
# call: the pytriton wheel (55 MB) plus its dependencies do not fit, so they are
# unpacked, pruned (other Pythons' stubs, a vendored libpython3.13 nothing loads,
# tritonclient's perf_analyzer binaries) and packed with xz: 32 MB.
set -e
echo /.whl/ >> .git/info/exclude
P="--platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
   --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"
D="python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $P"
$D -d /tmp/deps nvidia-pytriton==0.7.0 tritonclient==2.51.0 pyzmq sh importlib_metadata python-rapidjson \
   geventhttpclient gevent greenlet brotli zope.event zope.interface
rm -rf /tmp/site && mkdir -p /tmp/site .whl/stub && cd /tmp/site
for w in /tmp/deps/*.whl; do unzip -q -o "$w"; done
mv tritonclient-2.51.0.data/purelib/* . && rm -rf tritonclient-2.51.0.data
rm -rf pytriton/tritonserver/python_backend_stubs/3.{8,9,10,11,13} nvidia_pytriton.libs/libpython3-*.13.so.1.0
find . -name __pycache__ -prune -exec rm -rf {} +
cd - && tar -C /tmp/site -cJf .whl/site.tar.xz .
$D -d .whl crc32c                        # ordeal/history/ needs it; the image lacks it
$D -d .whl/stub numpy==1.26.4            # for Triton's Python backend stub only (see device-run.sh)
cp docs/examples/gpu-triton-h200/device-run.sh .whl/dev.sh
cp docs/examples/gpu-triton-h200/triton-smoke.py .whl/tri_smoke.py
