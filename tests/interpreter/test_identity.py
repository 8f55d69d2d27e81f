"""Which addresses a trusted user header is believed from."""

from __future__ import annotations

from sandbank.interpreter.identity import is_trusted, parse_networks


def test_only_configured_proxies_are_trusted() -> None:
    networks = parse_networks("10.0.0.0/8, 192.168.1.5 ,::1")
    assert is_trusted("10.2.3.4", networks)
    assert is_trusted("192.168.1.5", networks)
    assert is_trusted("::1", networks)
    assert not is_trusted("192.168.1.6", networks)
    assert not is_trusted("127.0.0.1", networks)
    assert not is_trusted(None, networks)
    assert not is_trusted("not-an-address", networks)
    assert not is_trusted("10.2.3.4", parse_networks(""))
