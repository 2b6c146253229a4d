"""Where traffic may go (the ownership contract's last part,
ordeal/ownership.py): loopback, plus networks the session names (the
user's ``--allow-target``, the Docker cluster's own subnet) for as long as
it names them (``SESSION_NETWORKS``). Load and faults refuse anything else
before a byte is sent (``NotOurs``)."""

from __future__ import annotations

import ipaddress

from ordeal.topology import Endpoint

# -- what the session may touch ---------------------------------------------------

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


LOOPBACK: tuple[Network, ...] = (ipaddress.ip_network("127.0.0.0/8"),
                                 ipaddress.ip_network("::1/128"))


class NotOurs(ValueError):
    """An address outside what the session may touch, or a network that is
    not one; the message says which and what to do."""


class Allowance:
    """One network allowed until ``undo()`` (or the end of a ``with``)."""

    def __init__(self, networks: AllowedNetworks, net: Network | str):
        self.net = net  # a network, or a host name (str) of a target file
        self._networks = networks
        self._done = False

    def undo(self) -> None:
        """Stop allowing it (once; another allowance of the same network
        keeps it allowed)."""
        if not self._done:
            self._done = True
            if isinstance(self.net, str):
                self._networks._hosts.remove(self.net)
            else:
                self._networks._extra.remove(self.net)

    def __enter__(self) -> Allowance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def parse_network(text: str) -> Network:
    """An address or a CIDR as a network; ``NotOurs`` when it is neither."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError as e:
        raise NotOurs(f"{text!r}: not a network ({e}); give an address or a CIDR such "
                      "as 10.0.0.0/24") from None


#: The widest network ``--allow-target`` takes unless ``--allow-wide-target``
#: is also given, by IP version: a typo (``/0`` for ``/24``) or a guess
#: should not make every address on the way a target of load and faults.
WIDEST_PREFIX = {4: 16, 6: 48}


def too_wide(net: Network) -> str | None:
    """Why ``net`` is too wide to allow without ``--allow-wide-target``
    (wider than ``WIDEST_PREFIX``), or None."""
    widest = WIDEST_PREFIX[net.version]
    if net.prefixlen >= widest:
        return None
    return (f"{net} is {net.num_addresses:,} addresses, wider than the /{widest} allowed "
            f"without --allow-wide-target; name the network of the deployment itself (e.g. "
            f"{'10.0.0.0/24' if net.version == 4 else '2001:db8:1:2::/64'}), or, if every "
            f"address in {net} is yours to load and break, add --allow-wide-target")


def reach(net: Network | str) -> str:
    """What allowing ``net`` lets load and faults reach, in words."""
    if isinstance(net, str):
        return f"the host name {net} (only as the target file names it)"
    if net.num_addresses == 1:
        return f"{net.network_address} (one address)"
    return (f"{net} ({net[0]} to {net[-1]}, {net.num_addresses:,} addresses)")


class AllowedNetworks:
    """The networks load and faults may reach: loopback always, and each
    network someone allowed until they undo it."""

    def __init__(self) -> None:
        self._extra: list[Network] = []
        self._hosts: list[str] = []  # host names a target file names, allowed by the user

    @property
    def networks(self) -> list[Network]:
        return [*LOOPBACK, *dict.fromkeys(self._extra)]

    def allow(self, net: str | Network) -> Allowance:
        """Allow ``net`` (an address or a CIDR); ``NotOurs`` when it is not one."""
        if isinstance(net, str):
            net = parse_network(net)
        self._extra.append(net)
        return Allowance(self, net)

    def allow_host(self, name: str) -> Allowance:
        """Allow the host name ``name`` itself (never what else resolves to
        its addresses): ``--allow-target NAME`` for a name a target file
        (``--cluster external``) gives. The caller checks the file names it."""
        name = name.strip().lower().rstrip(".")
        if not name or not all(part and len(part) < 64 and part.replace("-", "").isalnum()
                               for part in name.split(".")):
            raise NotOurs(f"{name!r}: not a host name; give an address, a CIDR such as "
                          "10.0.0.0/24, or a host name the target file names")
        self._hosts.append(name)
        return Allowance(self, name)

    def require_ours(self, endpoint: Endpoint, what: str) -> None:
        """``NotOurs`` unless ``endpoint`` is in an allowed network. Host
        names other than ``localhost`` are refused: a name can resolve
        anywhere."""
        host = "127.0.0.1" if endpoint.host == "localhost" else endpoint.host
        if host.lower().rstrip(".") in self._hosts:
            return
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            raise NotOurs(f"{what}: {endpoint.host!r} is not an IP address; the suite acts only "
                          "on loopback and on networks it created (a host name of a --target "
                          "file is allowed with --allow-target NAME)") from None
        if not any(addr in net for net in self.networks):
            raise NotOurs(
                f"{what}: refusing to touch {endpoint.host}:{endpoint.port}: it is outside "
                "loopback and the suite's own namespaces and containers. Ordeal only breaks "
                "what it started; if this address is yours to break, name its network with "
                "--allow-target CIDR.")


#: This process's allowed networks: the pytest session (or CLI) allows the
#: user's networks at start, a Docker cluster its subnet while it runs.
SESSION_NETWORKS = AllowedNetworks()
