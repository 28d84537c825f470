"""Refuse webhook URLs that reach inside the network (server-side request forgery).

A URL's host is resolved and every address it resolves to must be public, unless it lies inside one of
WEBHOOK_ALLOWED_NETWORKS. Checked when an endpoint is registered and again before each delivery (DNS may have
changed since)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from apps.events import conf

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class UnsafeUrl(ValueError):
    """The URL is malformed, or reaches an address webhooks may not be sent to."""


def _allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(cidr.strip(), strict=False) for cidr in conf.ALLOWED_NETWORKS if cidr.strip()]


def address_is_refused(address: Address) -> bool:
    """Loopback, link-local, private, multicast, reserved or unspecified: refused unless explicitly allowed."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if any(address in network for network in _allowed_networks()):
        return False
    return bool(
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
    )


def check_url(url: str) -> None:
    """Raise UnsafeUrl unless `url` is http(s) and every address its host resolves to may be reached."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeUrl("The URL must be http:// or https:// with a host.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError) as exc:
        raise UnsafeUrl(f"The host {parts.hostname} does not resolve.") from exc
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address_is_refused(address):
            raise UnsafeUrl(
                f"The host {parts.hostname} resolves to {address}, a private, loopback or link-local address; "
                "an administrator can allow its network in WEBHOOK_ALLOWED_NETWORKS."
            )
