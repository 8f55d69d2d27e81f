"""Network policies: parsing, matching, the address checks and clamping a client's hint."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from sandbank.egress.policy import NetworkPolicy, PolicyError, is_public, normalize_name
from sandbank.sandbox.egress import EgressConfig
from tests.support import settings


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def test_exact_names_and_suffix_patterns_match_with_their_ports() -> None:
    p = NetworkPolicy.parse(["pypi.org:443", "*.example.com:443", "api.test:*"])
    assert p.allows_name("pypi.org", 443)
    assert not p.allows_name("pypi.org", 80)
    assert not p.allows_name("evilpypi.org", 443)
    assert not p.allows_name("pypi.org.evil.com", 443)
    assert p.allows_name("a.example.com", 443) and p.allows_name("a.b.example.com", 443)
    assert not p.allows_name("example.com", 443)  # `*.x` is the names under x, not x itself
    assert not p.allows_name("badexample.com", 443)
    assert p.allows_name("api.test", 1) and p.allows_name("api.test", 65535)


def test_entries_that_do_not_parse_are_refused_with_the_entry() -> None:
    for bad in ("pypi.org", "pypi.org:0", "pypi.org:70000", "*:443", "a..b:443", "x y:1",
                "[::1:443", "10.0.0.1/8:443", "-a.com:443", "*.*.com:443"):  # fmt: skip
        with pytest.raises(PolicyError, match="'"):
            NetworkPolicy.parse([bad])
    with pytest.raises(ValueError, match=r"pypi\.org"):
        settings(Path("/tmp"), egress_allow="pypi.org")
    with pytest.raises(ValueError, match="NAME=ADDRESS"):
        settings(Path("/tmp"), egress_test_hosts="a.test=not-an-address")


def test_none_and_empty_are_no_network() -> None:
    assert NetworkPolicy.from_setting("none").is_none
    assert NetworkPolicy.from_setting(" ").is_none
    assert str(NetworkPolicy()) == "none"


def test_ip_literals_in_any_notation_are_not_names() -> None:
    for text in ("127.0.0.1", "127.1", "0x7f.1", "2130706433", "017700000001", "1.2.3.4."):
        assert normalize_name(text) is None, text
    assert normalize_name("PyPI.org.") == "pypi.org"
    assert normalize_name("xn--bcher-kva.example") == "xn--bcher-kva.example"
    assert normalize_name("bücher.example") is None  # IDNA is the client's job


def test_non_public_and_metadata_addresses_are_not_public() -> None:
    for text in ("127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
                 "100.64.0.1", "100.100.100.200", "168.63.129.16", "0.0.0.0", "224.0.0.1",
                 "255.255.255.255", "::1", "fe80::1", "fd00:ec2::254", "fc00::1", "ff02::1",
                 "::ffff:127.0.0.1", "::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:a00:1::1",
                 "240.0.0.1", "192.0.0.192"):  # fmt: skip
        assert not is_public(ip(text)), text
    for text in ("151.101.0.223", "8.8.8.8", "2a04:4e42::223", "::ffff:8.8.8.8"):
        assert is_public(ip(text)), text


def test_addresses_and_ranges_are_allowed_only_when_listed_with_the_port() -> None:
    p = NetworkPolicy.parse(["127.0.0.1:8080", "10.0.0.0/8:443", "[::1]:*"])
    assert p.allows_address(ip("127.0.0.1"), 8080)
    assert p.allows_address(ip("::ffff:127.0.0.1"), 8080)
    assert not p.allows_address(ip("127.0.0.1"), 8081)
    assert not p.allows_address(ip("127.0.0.2"), 8080)
    assert p.allows_address(ip("10.9.8.7"), 443) and not p.allows_address(ip("11.0.0.1"), 443)
    assert p.allows_address(ip("::1"), 5) and not p.allows_name("127.0.0.1", 8080)
    assert p.entries() == ["127.0.0.1:8080", "10.0.0.0/8:443", "[::1]:*"]


def test_a_hint_is_clamped_to_the_ceiling_never_widened() -> None:
    ceiling = NetworkPolicy.parse(["pypi.org:443", "*.example.com:443", "10.0.0.0/8:*"])
    hint = NetworkPolicy.parse(
        ["pypi.org:443", "pypi.org:80", "*.com:443", "*.example.com:443", "*.a.example.com:443",
         "x.example.com:443", "example.com:443", "evil.org:443", "10.1.0.0/16:443",
         "10.0.0.0/7:443", "11.0.0.1:443"]
    )  # fmt: skip
    assert hint.clamp(ceiling).entries() == [
        "pypi.org:443", "*.example.com:443", "*.a.example.com:443", "x.example.com:443",
        "10.1.0.0/16:443",
    ]  # fmt: skip
    assert NetworkPolicy.parse(["a.com:*"]).clamp(NetworkPolicy.parse(["a.com:443"])).is_none
    assert hint.clamp(NetworkPolicy()).is_none


def test_the_operator_default_applies_without_a_hint_and_a_hint_is_clamped() -> None:
    s = settings(Path("/tmp"), egress_allow="pypi.org:443", egress_allow_max="*.org:443")
    config = EgressConfig.from_settings(s)
    assert config.enabled
    assert config.effective(None).entries() == ["pypi.org:443"]
    wide = NetworkPolicy.parse(["files.pythonhosted.org:443", "evil.com:443"])
    assert config.effective(wide).entries() == ["files.pythonhosted.org:443"]
    assert not EgressConfig.from_settings(settings(Path("/tmp"))).enabled
