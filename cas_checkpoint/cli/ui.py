"""``cas-checkpoint ui``: serve the read-only history viewer (``cas_checkpoint.ui``) of a store
on 127.0.0.1 (``pip install 'cas_checkpoint[ui]'``). The viewer has no authentication: any
other ``--host`` gets a warning."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from collections.abc import Callable
from typing import Any

from cas_checkpoint.cli.common import OK, CliError, open_store

DEFAULT_PORT = 8765


def add(cmd: Callable[..., argparse.ArgumentParser]) -> None:
    p = cmd("ui", cmd_ui, "browse a store's threads, histories, states and diffs in a web "
            "browser (read-only; needs `pip install 'cas_checkpoint[ui]'`)")
    p.add_argument("store")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; the "
                   "viewer has no authentication)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one)")


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def cmd_ui(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from cas_checkpoint.ui import create_app
    except ImportError as exc:
        raise CliError(f"the viewer needs its extra: pip install 'cas_checkpoint[ui]' "
                       f"({exc})") from None
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port} is not a port; give one from 1 to 65535 (0: any "
                       "free one)")
    store = open_store(args)
    hosts: list[str] = []
    if not loopback(args.host):
        print(f"cas-checkpoint: warning: --host {args.host} serves this store to the network "
              "with no authentication: anyone who reaches this port reads every state. Use "
              "--host 127.0.0.1 (the default) and an SSH tunnel unless that is what you want",
              file=sys.stderr)
        hosts = ["*"]  # reached by any name: the warning above says what that means
    app: Any = create_app(store, allowed_hosts=hosts)
    family = socket.AF_INET6 if ":" in args.host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:  # bound here, so the address printed is the one served (--port 0 too)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host.strip("[]"), args.port))
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on --host {args.host} --port {args.port}: "
                       f"{exc.strerror or exc}; pick another --port (0: any free one)") from None
    port = sock.getsockname()[1]
    shown = f"[{args.host.strip('[]')}]" if family == socket.AF_INET6 else args.host
    print(f"serving http://{shown}:{port} (read-only) for {store.url}; Ctrl-C stops",
          flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # Ctrl-C: how a viewer is stopped, not an error
        pass
    print("stopped", file=sys.stderr)
    return OK
