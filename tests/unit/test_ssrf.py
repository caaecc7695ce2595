"""Which addresses a push target may reach (scheduler/delivery/ssrf.py), address by address.

IPv6 has several ways to carry an IPv4 address (NAT64, 6to4, IPv4-compatible,
IPv4-translated, IPv4-mapped); on a host with DNS64/NAT64 or 6to4 relays they
reach the IPv4 address they carry, so each is judged as that address.
"""

from __future__ import annotations

import pytest

from scheduler.delivery.ssrf import AddressPolicy, check_url
from scheduler.errors import ValidationError

DEFAULT = AddressPolicy()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.100.100.200", "0.0.0.0",
        "224.0.0.1", "255.255.255.255", "::1", "::", "fe80::1", "fd00:ec2::254", "ff02::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b::a00:1",  # NAT64 (RFC 6052) of loopback, metadata, 10/8
        "64:ff9b:1::a9fe:a9fe",  # local-use NAT64 (RFC 8215)
        "2002:7f00:1::", "2002:a9fe:a9fe::1",  # 6to4 of loopback and metadata
        "::127.0.0.1", "::169.254.169.254",  # IPv4-compatible (deprecated)
        "::ffff:0:7f00:1", "::ffff:0:a9fe:a9fe",  # IPv4-translated (RFC 2765)
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    ],
)  # fmt: skip
def test_refused_by_default(address: str) -> None:
    assert not DEFAULT.allows(address)


@pytest.mark.parametrize(
    "address",
    ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "64:ff9b::5db8:d822", "2002:5db8:d822::1", "::ffff:8.8.8.8"],
)
def test_public_addresses_pass_also_when_carried_in_ipv6(address: str) -> None:
    assert DEFAULT.allows(address)


def test_an_allowlisted_network_passes_in_every_form_that_carries_it() -> None:
    policy = AddressPolicy.parse("127.0.0.0/8")
    for address in ("127.0.0.1", "::ffff:127.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::", "::ffff:0:7f00:1"):
        assert policy.allows(address), address
    assert not policy.allows("169.254.169.254") and not policy.allows("64:ff9b::a9fe:a9fe")


def test_a_url_whose_host_is_an_ipv6_carrying_loopback_is_refused_at_save() -> None:
    with pytest.raises(ValidationError, match=r"^url: resolves to an address push targets may not reach"):
        check_url("http://[64:ff9b::7f00:1]/hook", DEFAULT)


@pytest.mark.parametrize("allow", ["0.0.0.0/0", "128.0.0.0/1", "160.0.0.0/4", "100.64.0.0/10", "::/0", "fd00::/8"])
@pytest.mark.parametrize("metadata", ["169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254"])
def test_a_broad_allowlist_does_not_open_the_cloud_metadata_addresses(allow: str, metadata: str) -> None:
    # "Allow everything" written as 0.0.0.0/0 meant the tenants' private targets, not the
    # instance's credentials: a metadata address is allowed only by an entry of /16 (IPv4) or
    # /64 (IPv6) or narrower that holds it.
    assert not AddressPolicy.parse(allow).allows(metadata)
    assert not AddressPolicy.parse(allow + ",::/0").allows("::ffff:169.254.169.254")


@pytest.mark.parametrize(
    ("allow", "metadata"),
    [
        ("169.254.0.0/16", "169.254.169.254"),
        ("169.254.169.254/32", "169.254.169.254"),
        ("fd00:ec2::/64", "fd00:ec2::254"),
    ],
)
def test_a_metadata_address_named_by_a_narrow_entry_is_allowed(allow: str, metadata: str) -> None:
    policy = AddressPolicy.parse(allow)
    assert policy.allows(metadata)
    assert AddressPolicy.parse("0.0.0.0/0").allows("10.1.2.3")  # a broad entry still opens the rest


@pytest.mark.parametrize(
    ("entry", "suggest"),
    [("127.0.0.5/8", "127.0.0.0/8 or 127.0.0.5/32"), ("10.1.2.3/16", "10.1.0.0/16 or 10.1.2.3/32"),
     ("fd00::5/64", "fd00::/64 or fd00::5/128")],
)  # fmt: skip
def test_an_allowlist_entry_with_host_bits_is_refused_not_widened(entry: str, suggest: str) -> None:
    """``127.0.0.5/8`` was read as all of 127.0.0.0/8: an allowlist wider than the operator
    may have meant (a trial). Refused, naming both readings."""
    with pytest.raises(ValidationError) as caught:
        AddressPolicy.parse(f"192.168.1.0/24,{entry}")
    assert str(caught.value) == (
        f"push_allow: an entry with host bits set is ambiguous: write {suggest} (got '{entry}')"
    )
    assert AddressPolicy.parse("127.0.0.5").allows("127.0.0.5")  # an address alone is its /32
    assert not AddressPolicy.parse("127.0.0.5").allows("127.0.0.6")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # A trial: the refusal echoed the password, or a token in the query.
        ("http://user:SECRET123@1.1.1.1:99999/", "http://***@1.1.1.1:99999/"),
        ("http://1.1.1.1:99999/x?token=SECRET123", "http://1.1.1.1:99999/***?***"),
        ("http://1.1.1.1/a b?token=SECRET123", "http://1.1.1.1/***?***"),
        ("http://1.1.1.1:99999/x#frag-SECRET123", "http://1.1.1.1:99999/***#***"),
        ("http://:p@SECRET123@/", "http://***@/"),
        ("http:///path?token=SECRET123", "http:///***?***"),
        ("https://u@[::1:99999/?SECRET123", "https://***@[::1:99999/?***"),
        # A second trial: a password holding an unescaped / ? or # (the URL is malformed, the
        # password still a password): everything up to the last @ is hidden.
        ("https://user:s3cret/SECRET123@93.184.216.34/x", "https://***@93.184.216.34/***"),
        ("https://user:s3cret?SECRET123@93.184.216.34/x", "https://***@93.184.216.34/***"),
        ("https://user:s3cret#SECRET123@93.184.216.34/x", "https://***@93.184.216.34/***"),
        ("https:///user:SECRET123@1.2.3.4/?q=x", "https://***@1.2.3.4/?***"),
        # A webhook's secret in its path (a bad port here).
        ("https://hooks.example.com:0x1/services/T0/B0/SECRET123", "https://hooks.example.com:0x1/***"),
    ],
)
def test_a_refused_url_is_echoed_without_credentials_path_query_or_fragment(url: str, shown: str) -> None:
    with pytest.raises(ValidationError) as refused:
        check_url(url, DEFAULT, resolve=lambda host, port: ["93.184.216.34"])
    assert "SECRET123" not in str(refused.value)
    assert str(refused.value).endswith(f"(got {shown!r})"), str(refused.value)


def test_a_too_long_url_is_echoed_clipped_and_without_its_query() -> None:
    url = "https://example.com/" + "a" * 3000 + "?token=SECRET123"
    with pytest.raises(ValidationError, match=r"^url: must be at most \d+ characters") as refused:
        check_url(url, DEFAULT, resolve=lambda host, port: ["93.184.216.34"])
    assert "SECRET123" not in str(refused.value)


def test_a_url_that_is_not_a_string_is_refused_without_echoing_it() -> None:
    """A second trial: the API's ``"url": ["https://u:pw@host/?q=token"]`` was echoed whole."""
    with pytest.raises(ValidationError) as refused:
        check_url(["https://u:SECRET123@1.2.3.4/?q=SECRET123"], DEFAULT)  # type: ignore[arg-type]
    assert str(refused.value) == "url: must be an http(s) URL (a string)"


def test_a_url_without_a_scheme_is_refused_without_echoing_its_user_info() -> None:
    """A third trial: ``TOKEN:@host/x`` reads as the scheme ``token``, which the scheme rule echoed."""
    with pytest.raises(ValidationError) as refused:
        check_url("a1b2c3SECRET123:@93.184.216.34/x", DEFAULT)
    assert str(refused.value) == "url: scheme must be http or https (got '***@93.184.216.34/***')"
    with pytest.raises(ValidationError) as refused:
        check_url("ftp://93.184.216.34/x", DEFAULT)
    assert str(refused.value) == "url: scheme must be http or https (got 'ftp')"
