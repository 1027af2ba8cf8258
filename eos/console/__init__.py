"""The eos web console (`eos console`): brokers, topics, consumer groups, transactions and
throughput of a cluster, over eos.Admin.

Theory of operation
-------------------
A small server-rendered web app, no JavaScript build: Flask renders Jinja templates from
what `views` gathers with the Admin API, waitress serves it (`server`), plain CSS and two
tiny scripts (the live chart, the Abort confirmation) are its static files.

    views       one function per page: Admin answers in, a dict of plain values out
    app         Flask: each page as HTML and JSON (/api/...), the Abort action, errors, headers
    throughput  records/s per topic from sampled end offsets (sampled on request, bounded)
    server      waitress in the foreground (the CLI) or on a thread (tests, bench)
    cli         `eos console --bootstrap HOST:PORT --port 8080 [--command-config FILE]`

The console connects as one client, the principal its --command-config describes (TLS,
SASL as every eos client), and can do only what that principal's ACLs allow: it shows the
Abort button for hanging transactions only when the broker says (KIP-430's authorized
operations) the principal may abort them.
"""
from __future__ import annotations

from eos.console.app import create_app
from eos.console.server import ConsoleServer

__all__ = ["ConsoleServer", "create_app"]
