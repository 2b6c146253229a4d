#!/bin/bash
# On a machine with pip access, from anywhere in the repository:
#     bash docs/examples/gpu-vllm/make-wheels.sh
# Downloads exactly the wheels in wheels.txt (what the GPU machine lacks for vLLM 0.26.0
# and vllm-router 0.1.17; resolve.py made that list) into .whl/vllm/ (git-ignored), splits
# the vLLM wheel, and packs everything into chunk folders c1, c2, ... of at most CHUNK_MIB
# MiB each, the biggest first, so that each folder fits one device call: a call carries at
# most 64 MiB, the repository's tracked files (about 12.4 MiB) included. SHA256SUMS (in c1)
# holds the sha256 of every whole wheel; device-run.sh reassembles and checks them.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=docs/examples/gpu-vllm
W=.whl/vllm
DL=${DL:-/tmp/gpuvllm/wheels}
CHUNK_MIB=${CHUNK_MIB:-49}
git check-ignore -q "$W/x" || { echo "$W is not git-ignored: it would travel twice" >&2; exit 1; }

P="--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
for v in 39 38 37 36 35 34 33 32 31 30 29 28 27 26 25 24; do P="$P --platform manylinux_2_${v}_x86_64"; done
P="$P --platform linux_x86_64 --platform any"
mkdir -p "$DL"
# one pip process, no parallel downloads
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $P -d "$DL" -r $HERE/wheels.txt

# Where a package has several builds, the bulk download may pick another than the one
# listed (seen: apache-tvm-ffi 0.1.10, manylinux2014 instead of manylinux_2_28): fetch each
# missing listed file again with only the platform tags its own name carries.
for line in $(sed -n 's/^\([^ #]*\)==\([^ ]*\) .* MiB \([^ ]*\.whl\)$/\1==\2@\3/p' $HERE/wheels.txt); do
    req=${line%@*}; f=${line#*@}
    [ -f "$DL/$f" ] && continue
    tags=$(echo "${f%.whl}" | awk -F- '{print $NF}' | tr . ' ')
    TP=""; for t in $tags; do TP="$TP --platform $t"; done
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        $TP -d "$DL" "$req"
done

# exactly the listed files, one version of each
rm -rf "$W" && mkdir -p "$W/all"
for f in $(sed -n 's/.* MiB \([^ ]*\.whl\)$/\1/p' $HERE/wheels.txt); do
    [ -f "$DL/$f" ] || { echo "missing $DL/$f" >&2; exit 1; }
    cp "$DL/$f" "$W/all/"
done
n_listed=$(grep -c '^[a-z0-9].*==' $HERE/wheels.txt); n_got=$(ls "$W/all" | wc -l)
[ "$n_listed" = "$n_got" ] || { echo "listed $n_listed wheels, have $n_got" >&2; exit 1; }
(cd "$W/all" && sha256sum *.whl) > "$W/SHA256SUMS"
cp "$W/SHA256SUMS" $HERE/SHA256SUMS
du -sm "$W/all"

# split wheels over CHUNK_MIB into NAME.whl.part00, part01, ...
for f in "$W"/all/*.whl; do
    if [ "$(stat -c %s "$f")" -gt $((CHUNK_MIB * 1048576)) ]; then
        split -d -b "${CHUNK_MIB}M" "$f" "$f.part" && rm "$f"
    fi
done
# first-fit decreasing into c1..cN, then renumbered so that c1 is the fullest and cN
# the emptiest (cN travels with the call that installs and serves)
python3 - "$W" "$CHUNK_MIB" <<'EOF'
import os, sys
from pathlib import Path
w, cap = Path(sys.argv[1]), int(sys.argv[2]) * 2**20
files = sorted((w / "all").iterdir(), key=lambda f: -f.stat().st_size)
bins: list[list] = []
for f in files:
    size = f.stat().st_size
    for b in bins:
        if b[0] + size <= cap:
            b[0] += size; b[1].append(f); break
    else:
        bins.append([size, [f]])
bins.sort(key=lambda b: -b[0])
for i, (size, fs) in enumerate(bins, 1):
    d = w / f"c{i}"
    d.mkdir()
    for f in fs:
        os.rename(f, d / f.name)
    print(f"c{i}: {size / 2**20:.1f} MiB, {len(fs)} files")
(w / "all").rmdir()
EOF
mv "$W/SHA256SUMS" "$W/c1/"
ls "$W"
