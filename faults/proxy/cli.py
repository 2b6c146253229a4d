"""``python -m faults.proxy``: run the fault proxy as a process of its own.

    python -m faults.proxy --control 127.0.0.1:CPORT \\
        --link NAME=LISTENPORT:UPSTREAMHOST:UPSTREAMPORT [--link ...] --seed N

With no ``--link`` it starts with none: links are then made over the control
API's Toxiproxy face (``POST /proxies``), as with a ``toxiproxy-server``.

Listens on 127.0.0.1 and forwards only to loopback, unless the suite names
a network it created with ``--allow-upstream CIDR`` (a Docker network of the
run), on whose address ``--listen-host`` may then be too. Prints one line
``ORDEAL-PROXY READY control=HOST:PORT links=NAME=HOST:PORT>UHOST:UPORT,...``
on stdout once every listener is up (port 0 picks a free port; the line
says which), logs to stderr, and exits 0 on SIGTERM or SIGINT after closing
its listeners. Its process title starts with ``ordeal-proxy`` so it can be
recognised in ``ps``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import resource
import signal
import sys

from .link import LinkError, LinkSpec
from .server import FaultProxy

log = logging.getLogger("ordeal.proxy")


def set_title(title: str) -> None:
    """Name the process for ps/top: the full title when setproctitle is
    installed, the 15-byte kernel name (prctl PR_SET_NAME) always."""
    try:
        import setproctitle  # type: ignore[import-not-found]

        setproctitle.setproctitle(title)
    except ImportError:
        pass
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(b"ordeal-proxy"), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m faults.proxy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--control", default="127.0.0.1:0",
                    help="control API address HOST:PORT (loopback only; port 0 = any free)")
    ap.add_argument("--link", action="append", default=[], metavar="NAME=LPORT:UHOST:UPORT",
                    help="a link to proxy; repeat for several")
    ap.add_argument("--listen-host", default="127.0.0.1",
                    help="address every link listens on (loopback, or in an --allow-upstream "
                         "network)")
    ap.add_argument("--allow-upstream", action="append", default=[], metavar="CIDR",
                    help="a network the suite created that links may listen on and forward "
                         "to (e.g. the run's Docker network); repeat for several")
    ap.add_argument("--seed", type=int, default=0, help="seed of toxicity and jitter draws")
    ap.add_argument("--log-level", default="INFO")
    return ap.parse_args(argv)


async def serve(proxy: FaultProxy) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await proxy.start()
    set_title(f"ordeal-proxy control={proxy.control_host}:{proxy.control_port} "
              f"links={','.join(proxy.links)}")
    print(proxy.ready_line(), flush=True)
    log.info("%s", proxy.ready_line())
    await stop.wait()
    log.info("stopping on signal")
    await proxy.stop()


def raise_fd_limit() -> None:
    """Up to the hard limit: a spliced connection holds six descriptors (two
    sockets, two pipes), and the soft limit is often 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_fd_limit()
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="[ordeal-proxy %(asctime)s] %(levelname)s %(message)s")
    try:
        host, _, port = args.control.rpartition(":")
        if not port.isdigit():
            raise LinkError(f"--control {args.control!r}: write HOST:PORT, e.g. 127.0.0.1:18100")
        allowed = tuple(args.allow_upstream)
        specs = [LinkSpec.parse(text, args.listen_host, allowed) for text in args.link]
        proxy = FaultProxy(specs, host.strip("[]") or "127.0.0.1", int(port), args.seed,
                           allowed)
    except LinkError as e:
        print(f"ordeal-proxy: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(proxy))
    except OSError as e:
        print(f"ordeal-proxy: cannot listen: {e}; pick free ports (or 0 for any)",
              file=sys.stderr)
        return 1
    return 0
