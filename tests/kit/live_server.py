"""Loopback helpers for the server tests (the server itself runs with ``server.app.serve_in_background``)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """Return a loopback port nothing listens on (for 'unreachable' tests and subprocess servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
