"""Which addresses an HTTP target may reach (no SSRF), at save time and at connect time.

A push target's URL must be ``http`` or ``https`` with a host, and every
address its host resolves to must be *allowed*: a global unicast address
(:attr:`ipaddress.IPv4Address.is_global`), or one inside a network of the
operator's allowlist (setting ``push_allow``, e.g. ``10.0.0.0/8,127.0.0.1/32``).
So by default loopback, private (RFC 1918, ULA), link-local (including the
cloud metadata address 169.254.169.254), shared (100.64.0.0/10, where
Alibaba's metadata lives), multicast, reserved and unspecified addresses are
refused — the OWASP SSRF rule of "deny everything not public". An IPv6
address that carries an IPv4 address is judged as the IPv4 address it
carries, since a host with the matching translator or relay reaches that
address through it: IPv4-mapped (``::ffff:a.b.c.d``), IPv4-translated
(``::ffff:0:a.b.c.d``, RFC 2765), IPv4-compatible (``::a.b.c.d``), NAT64's
well-known prefix (``64:ff9b::/96``, RFC 6052: DNS64 answers it on
IPv6-only networks) and 6to4 (``2002::/16``, RFC 3056). The local-use NAT64
prefix ``64:ff9b:1::/48`` (RFC 8215, operator-defined embedding) is refused
unless allowlisted, as is Teredo.

The check runs twice (docs/delivery.md, "Push"): when a job is saved
(:func:`check_url`, resolving the host: a name that resolves to a refused
address is refused, one that does not resolve at all is refused too) and
when the push client connects (:mod:`scheduler.delivery.curl` asks
:meth:`AddressPolicy.allows` about every address it is about to connect to,
after DNS), because DNS can change between the two.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from scheduler.errors import ValidationError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LEN = 2048

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")


METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle instance metadata
        "169.254.170.2",  # AWS ECS task credentials
        "100.100.100.200",  # Alibaba Cloud
        "fd00:ec2::254",  # AWS over IPv6
    )
)
"""Cloud instance-metadata endpoints (credentials for the machine the node runs on). An
allowlist entry opens one only if it holds it and is a /16 or narrower (IPv4; /64 for IPv6):
``0.0.0.0/0`` written to mean "any private target" does not hand out the node's credentials."""


def carried_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (see the module doc), or None."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or ip in _TRANSLATED or ip in _COMPATIBLE:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _resolve(host: str, port: int) -> list[str]:
    """Addresses ``host`` resolves to (``getaddrinfo``, TCP); raises OSError."""
    return sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


@dataclasses.dataclass(frozen=True)
class AddressPolicy:
    """The operator's allowlist: networks a push target may reach beyond the public internet.

    ``allow`` is empty by default (only global unicast addresses pass).
    """

    allow: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, text: str | None, field: str = "push_allow") -> AddressPolicy:
        """From a comma-separated list of CIDR networks or addresses (``None``/empty: nothing extra).

        Raises ValidationError naming ``field`` for an entry that is not a
        network (``10.0.0.0/8``, ``::1/128``) or an address, or is a network
        with host bits set (``127.0.0.5/8``: all of 127.0.0.0/8, or the one
        address? It was read as the first, wider than may have been meant).
        """
        networks: list[IPNetwork] = []
        for item in (text or "").split(","):
            item = item.strip()
            if not item:
                continue
            try:
                network = ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValidationError(
                    field, "must be a comma-separated list of networks or addresses (e.g. 10.0.0.0/8)", item
                ) from None
            address = ipaddress.ip_address(item.split("/", 1)[0])
            if address != network.network_address:
                raise ValidationError(
                    field,
                    f"an entry with host bits set is ambiguous: write {network} or {address}/{network.max_prefixlen}",
                    item,
                )
            networks.append(network)
        return cls(tuple(networks))

    def allows(self, address: str | IPAddress) -> bool:
        """True if a connection to ``address`` is allowed (see the module doc)."""
        try:
            ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address):
            carried = carried_ipv4(ip)
            if carried is not None and carried in METADATA_ADDRESSES:
                return self.allows(carried)  # ::ffff:169.254.169.254 under ::/0 is still the metadata
        if ip in METADATA_ADDRESSES:
            narrow = 16 if ip.version == 4 else 64
            return any(ip in network and network.prefixlen >= narrow for network in self.allow)
        if any(ip in network for network in self.allow):
            return True
        if isinstance(ip, ipaddress.IPv6Address):
            carried = carried_ipv4(ip)
            if carried is not None:
                return self.allows(carried)
            if ip in _NAT64_LOCAL:
                return False
        return ip.is_global and not ip.is_multicast

    def filter(self, addresses: Iterable[str]) -> list[str]:
        """The allowed ones of ``addresses``, in order."""
        return [a for a in addresses if self.allows(a)]


URL_CHARACTERS_RULE = "must not contain spaces or unprintable characters (percent-encode them: a space is %20)"
"""The rule a URL with a space or an unprintable character breaks (push targets, ``--api-url``)."""


def shown_url(url: str) -> str:
    """``url`` as a refusal may echo it: scheme and host (and port) as given, user info
    (everything up to the last ``@``, wherever it is) replaced by ``***@``, a path other
    than ``/`` by ``/***``, a query or fragment by ``?***`` / ``#***``. A push target URL
    may carry a password, a token in its query, or a secret in its path (webhook URLs
    often do); no rule whose refusal echoes a URL needs them to be understood. Works on any
    string, however malformed (it is what a refusal shows):
    ``http://u:pw@h:99999/hook/T0K3N?sig=x`` → ``http://***@h:99999/***?***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    hidden = ""
    if "@" in rest:  # a password may hold an unescaped / ? or #: hide up to the last @ anywhere
        hidden, rest = "***@", rest.rpartition("@")[2]
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    head, tail = rest[:cut], rest[cut:]
    end = head.find("/")
    authority, path = (head, "") if end < 0 else (head[:end], head[end:])
    authority = hidden + authority
    if path not in ("", "/"):
        path = "/***"
    return f"{scheme}{sep}{authority}{path}{tail[:1] + '***' if tail else ''}"


def split_url(url: str, field: str = "url") -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a push target URL; raises ValidationError naming ``field``.

    Rules: a string of at most :data:`MAX_URL_LEN` characters without
    spaces or unprintable characters (percent-encoded instead), scheme
    ``http`` or ``https``, a host, no user info (credentials belong in
    headers, which are never logged), no IPv6 zone (RFC 6874), a valid port. Each broken rule is
    named by its own message, which echoes the URL as :func:`shown_url`
    gives it (never its credentials, path, query or fragment).
    """
    if not isinstance(url, str):  # not echoed: a list or object may hold the URL, secrets and all
        raise ValidationError(field, "must be an http(s) URL (a string)")
    if not url:
        raise ValidationError(field, "must be an http(s) URL", url)
    if len(url) > MAX_URL_LEN:
        raise ValidationError(field, f"must be at most {MAX_URL_LEN} characters", shown_url(url))
    if not url.isprintable() or " " in url:
        raise ValidationError(field, URL_CHARACTERS_RULE, shown_url(url))
    try:
        parts = urlsplit(url)
        port = parts.port
        if "[" in parts.netloc:  # a bracketed host is an IPv6 literal; urlsplit also takes RFC 3986's IPvFuture
            ipaddress.IPv6Address((parts.hostname or "").split("%", 1)[0])
    except ValueError:
        raise ValidationError(field, "must be an http(s) URL with a valid host and port", shown_url(url)) from None
    if parts.scheme not in ("http", "https"):
        # With an @ in the URL, what reads as a scheme may be a user or a token: not echoed.
        raise ValidationError(field, "scheme must be http or https", shown_url(url) if "@" in url else parts.scheme)
    if not parts.hostname:
        raise ValidationError(field, "must name a host", shown_url(url))
    if parts.username is not None or parts.password is not None:
        raise ValidationError(field, "must not carry user:password (send credentials as a header)", parts.hostname)
    if "%" in parts.hostname:  # RFC 6874: [fe80::1%25eth0] (a zone scopes a link-local address)
        raise ValidationError(
            field,
            "must not name an IPv6 zone (%25...: push targets are reached without one)",
            shown_url(url),
        )
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def is_metadata(address: str) -> bool:
    """Whether ``address`` (text) is one of :data:`METADATA_ADDRESSES`, or an IPv6 address
    carrying one (:func:`carried_ipv4`)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        ip = carried_ipv4(ip) or ip
    return ip in METADATA_ADDRESSES


def check_url(
    url: str,
    policy: AddressPolicy,
    *,
    field: str = "url",
    resolve: Callable[[str, int], list[str]] = _resolve,
) -> None:
    """Refuse a push target URL that is malformed or reaches a refused address (save time).

    Resolves the host (``resolve(host, port)`` → addresses; the system
    resolver by default): every address must be allowed by ``policy``.
    Raises ValidationError naming ``field``: the URL rules of
    :func:`split_url`, a host that does not resolve, or the first refused
    address (the message names it and the setting that would allow it).
    """
    _, host, port = split_url(url, field)
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError):
        raise ValidationError(field, "host does not resolve", host) from None
    if not addresses:
        raise ValidationError(field, "host does not resolve", host)
    for address in addresses:
        if policy.allows(address):
            continue
        if is_metadata(address):
            raise ValidationError(
                field,
                "resolves to a cloud metadata address, which push targets may not reach; push_allow opens it "
                "only with an entry of /16 or narrower (/64 for IPv6), never through a wider network such as "
                "0.0.0.0/0",
                f"{host} -> {address}",
            )
        raise ValidationError(
            field,
            "resolves to an address push targets may not reach (loopback, private, link-local, metadata "
            "or reserved); an operator may allow a network with push_allow",
            f"{host} -> {address}",
        )
