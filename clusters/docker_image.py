"""The base image for ``--cluster docker``, built here, with no registry.

No image registry is reachable from these machines, and our users' own
engine images are theirs to name (``--docker-image``). So the default image
is a minimal Debian root file system made with ``debootstrap`` from the apt
mirror this machine already uses (read from its apt sources, never written
into the repository), imported with ``docker import``. The engines are not
in the image: the host's Python, the suite's virtual environment, the
repository and the model are bind-mounted read-only at the same paths, so
a container runs exactly the code the harness runs.

Building takes about a minute and 300 MB; the image is tagged with a hash of
its recipe and reused while the recipe is unchanged.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable

from ordeal.containers import IMAGE_LABEL, DockerUnavailable, docker_client

Progress = Callable[[str], None]

#: What the engines need beyond a minimal Debian: python3 brings the shared
#: libraries a bind-mounted Python links (libssl, libffi, sqlite, ...);
#: vLLM's CPU build needs libnuma1 and libgomp1 (seen failing without them).
PACKAGES = ("python3", "libnuma1", "libgomp1", "procps", "iproute2", "ca-certificates")
REPOSITORY = "ordeal-base"


class ImageError(RuntimeError):
    """The base image cannot be built here; the message says what to install
    or which image to name instead."""


def codename() -> str:
    """The Debian release of this machine (the image matches it, so the
    bind-mounted Python finds the same C library)."""
    text = Path("/etc/os-release").read_text() if Path("/etc/os-release").exists() else ""
    m = re.search(r"^VERSION_CODENAME=(\S+)$", text, re.M)
    if not m:
        raise ImageError("cannot tell the Debian release (/etc/os-release has no "
                         "VERSION_CODENAME); build an image yourself and pass --docker-image")
    return m.group(1).strip('"')


def apt_mirror(sources: list[Path] | None = None) -> str:
    """The first Debian mirror in this machine's apt sources (deb822
    ``.sources`` files or one-line ``sources.list``)."""
    if sources is None:
        d = Path("/etc/apt/sources.list.d")
        sources = sorted(d.glob("*.sources")) + sorted(d.glob("*.list")) if d.is_dir() else []
        sources.append(Path("/etc/apt/sources.list"))
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri in re.findall(r"^URIs:\s*(\S+)", text, re.M) + \
                re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M):
            if "security" not in uri:
                return uri
    raise ImageError("no apt mirror found in /etc/apt/sources.list(.d); configure apt, or "
                     "build an image yourself and pass --docker-image")


def image_tag() -> str:
    recipe = "|".join([codename(), platform.machine(), *PACKAGES]).encode()
    return f"{REPOSITORY}:{codename()}-{hashlib.sha256(recipe).hexdigest()[:12]}"


def ensure_base_image(client: Any, progress: Progress = print) -> str:
    """The tag of the base image, built now if this Docker engine lacks it."""
    tag = image_tag()
    if client.images.list(name=tag):
        return tag
    if os.geteuid() != 0:
        raise ImageError(f"the base image {tag} is missing and building it needs root "
                         "(debootstrap); run `python -m clusters.docker_image` as root once, "
                         "or pass --docker-image with an image of your own")
    if shutil.which("debootstrap") is None:
        raise ImageError(f"the base image {tag} is missing and debootstrap is not installed: "
                         "apt-get install debootstrap (bash .ci/setup does), or pass "
                         "--docker-image with an image of your own")
    mirror = apt_mirror()
    progress(f"building the base image {tag} with debootstrap ({codename()}, "
             f"{', '.join(PACKAGES)}); about a minute, once ...")
    with tempfile.TemporaryDirectory(prefix="ordeal-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
               codename(), str(rootfs), mirror]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise ImageError(f"debootstrap failed with code {done.returncode}:\n{tail}\n"
                             "check that the apt mirror is reachable (apt-get update)")
        tar_path = Path(tmp) / "rootfs.tar"
        with tarfile.open(tar_path, "w") as tar:
            tar.add(rootfs, arcname=".")
        repo, _, version = tag.partition(":")
        client.api.import_image(src=str(tar_path), repository=repo, tag=version,
                                changes=[f"LABEL {IMAGE_LABEL}=base"])
    progress(f"base image {tag} built")
    return tag


def main() -> int:

    try:
        print(ensure_base_image(docker_client()))
    except (ImageError, DockerUnavailable) as e:
        print(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
