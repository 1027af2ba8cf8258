"""`eos console`: the web console over a cluster, as the client its --command-config describes.

Theory of operation
-------------------
The command takes a client's settings the way every eos client command does
(eos.cli.add_client_arguments: --command-config FILE, --security-protocol, --ssl-*, --sasl-*),
builds one eos.Admin from them, and serves `eos.console.create_app` with waitress until
Ctrl-C. A page waits at most the Admin's default.api.timeout.ms for a cluster that does not
answer; the console's defaults are shorter than a batch tool's (a page, not a job), and a
--command-config that sets them wins.
"""
from __future__ import annotations

import argparse

# A page should fail in seconds, not the minute a batch tool waits (overridable in the file).
CONSOLE_CLIENT_DEFAULTS = {"request.timeout.ms": "5000", "default.api.timeout.ms": "15000"}


def add_commands(commands, add_client_arguments, default_bootstrap: str) -> None:
    console = commands.add_parser("console", help="serve the web console (brokers, topics, groups, transactions)")
    console.add_argument("--bootstrap", "--bootstrap-server", dest="bootstrap_server", default=default_bootstrap,
                         metavar="HOST:PORT", help="host:port of a broker")
    console.add_argument("--host", default="127.0.0.1",
                         help="address to listen on (default 127.0.0.1: the console has no login of its own)")
    console.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    console.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                         help="a host name browsers may use for the console besides --host and the loopback "
                              "names (requests naming any other are refused: DNS rebinding); repeatable")
    console.add_argument("--hanging-after-ms", type=int, default=None, metavar="MS",
                         help="an open transaction idle this long is hanging if no coordinator accounts for it "
                              "(default 900000, Kafka's transaction.max.timeout.ms)")
    add_client_arguments(console)
    console.set_defaults(handler=cmd_console)


def open_console(args: argparse.Namespace):
    """(the eos.Admin, the ConsoleServer bound but not started) that `eos console` runs with
    `args`; the caller closes the Admin."""
    import eos
    from eos.admin_transactions import MAX_TRANSACTION_TIMEOUT_MS
    from eos.cli import client_config
    from eos.console import ConsoleServer, create_app
    from eos.console.app import LOOPBACK_HOSTS

    hanging_after_ms = MAX_TRANSACTION_TIMEOUT_MS if args.hanging_after_ms is None else args.hanging_after_ms
    if hanging_after_ms < 0:
        raise ValueError(f"--hanging-after-ms must be >= 0, got {hanging_after_ms}")
    admin = eos.Admin(bootstrap=args.bootstrap_server, config={**CONSOLE_CLIENT_DEFAULTS, **client_config(args)})
    try:
        trusted_hosts = [*LOOPBACK_HOSTS, *([args.host] if args.host not in ("", "0.0.0.0", "::") else []),
                         *args.allowed_host]
        return admin, ConsoleServer(create_app(admin, hanging_after_ms=hanging_after_ms, trusted_hosts=trusted_hosts),
                                    host=args.host, port=args.port)
    except BaseException:
        admin.close()
        raise


def cmd_console(args: argparse.Namespace) -> int:
    admin, server = open_console(args)
    with admin:
        print(f"eos console on {server.url} (cluster at {args.bootstrap_server}); Ctrl-C stops it", flush=True)
        server.serve_forever()
    return 0
