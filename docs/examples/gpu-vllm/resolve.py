"""Which wheels the GPU machine lacks for vLLM 0.26.0 + vllm-router 0.1.17.

Walks the declared dependencies (Requires-Dist of each wheel's METADATA,
markers evaluated for CPython 3.12 on Linux x86_64), starting from the roots:
a dependency the GPU machine already has (device-pip-freeze.txt, `pip list` taken
there) or one left out on purpose (EXCLUDE) is not followed; any other one is
fetched with `pip download --no-deps` (the newest release that fits the first
requirement met) and walked in turn. Prints the chosen pins, and every
requirement the chosen or the device's versions do not meet (to judge by hand).

    python3 resolve.py DOWNLOAD_DIR > pins.txt      # on a machine with pip access
"""
from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

HERE = Path(__file__).resolve().parent
ROOTS = ["vllm==0.26.0", "vllm-router==0.1.17"]
# Left out (issue 42): not imported at module level by the API server, engine, GPU
# worker, Llama model or flash-attention paths; heavy or needing a compiler.
EXCLUDE = {canonicalize_name(n) for n in """
    tokenspeed-mla nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-cu13
    quack-kernels nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-nvcc-cu13 tilelang z3-solver
    opencv-python-headless numba llvmlite pynvvideocodec torchcodec flashinfer-python
    flashinfer-cubin humming-kernels nvidia-cudnn-frontend
""".split()}
# The device's version is kept although a requirement excludes it (walked no further).
KEEP_DEVICE = {"numpy"}   # mistral-common 1.13.1 asks numpy<2.4; the device has 2.5.2
# Versions chosen by hand where the first requirement met would pick a release that a
# later one excludes.
PINS = {"opentelemetry-api": "==1.45.2",  # opentelemetry-sdk 1.45.2 pins it
        "xgrammar": "==0.2.7"}  # 0.2.8+ need apache-tvm-ffi>=0.1.11, vLLM pins 0.1.10
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_system": "Linux",
       "platform_machine": "x86_64", "sys_platform": "linux", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython"}
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in (39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28,
                                                   27, 26, 25, 24, 17)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64", "any"]


def device_versions() -> dict[str, str]:
    out = {}
    for line in (HERE / "device-pip-freeze.txt").read_text().split():
        name, ver = line.split("==")
        out[canonicalize_name(name)] = ver
    return out


def download(req: str, dest: Path) -> Path:
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest), req]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"pip download {req} failed:\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    name = canonicalize_name(Requirement(req).name)
    new = set(dest.glob("*.whl")) - before
    cands = new or {w for w in dest.glob("*.whl")
                    if canonicalize_name(w.name.split("-")[0]) == name
                    and Requirement(req).specifier.contains(w.name.split("-")[1], prereleases=True)}
    return sorted(cands)[-1]


def metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if re.match(r"[^/]+\.dist-info/METADATA$", n))
        return Parser().parsestr(z.read(meta).decode())


def wanted(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**ENV, "extra": e}) for e in (extras or {""}))


def main() -> None:
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    device = device_versions()
    chosen: dict[str, tuple[str, Path]] = {}
    problems: list[str] = []
    queue = [(Requirement(r), "root") for r in ROOTS]
    while queue:
        req, parent = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in EXCLUDE:
            continue
        if name in device and name not in chosen:
            if req.specifier.contains(device[name], prereleases=True):
                continue
            if name in KEEP_DEVICE:
                problems.append(f"device has {name}=={device[name]}, {parent} wants {req} "
                                "(kept)")
                continue
            # else fetched, and installed into the vLLM environment over the device's
            print(f"# device has {name}=={device[name]}, {parent} wants {req}: fetched",
                  file=sys.stderr)
        if name in chosen:
            ver = chosen[name][0]
            if not req.specifier.contains(ver, prereleases=True):
                problems.append(f"chose {name}=={ver}, {parent} wants {req}")
            new_extras = set(req.extras)
        else:
            wheel = download(f"{name}{PINS.get(name, req.specifier)}", dest)
            ver = wheel.name.split("-")[1]
            chosen[name] = (ver, wheel)
            print(f"# {name}=={ver} <- {parent}", file=sys.stderr)
            new_extras = set(req.extras) | {""}
        if not new_extras:
            continue
        md = metadata(chosen[name][1])
        for line in md.get_all("Requires-Dist") or []:
            dep = Requirement(line)
            if dep.marker is not None and "extra" in str(dep.marker):
                if not any(dep.marker.evaluate({**ENV, "extra": e}) for e in new_extras - {""}):
                    continue
            elif "" not in new_extras or not wanted(dep, set()):
                continue
            queue.append((dep, f"{name}=={ver}"))
    for name, (ver, wheel) in sorted(chosen.items()):
        print(f"{name}=={ver}  # {wheel.stat().st_size / 2**20:.2f} MiB {wheel.name}")
    total = sum(w.stat().st_size for _, w in chosen.values())
    print(f"# total {total / 2**20:.1f} MiB in {len(chosen)} wheels")
    for p in problems:
        print(f"# UNMET: {p}")


if __name__ == "__main__":
    main()
