"""`python -m broker`: run one broker in the foreground (the same as `eos broker start`).

    python -m broker --data-dir DIR [--host 127.0.0.1] [--port 9092] [--node-id 0]
                     [--config NAME=VALUE ...]

Prints "eos broker listening on HOST:PORT (data dir DIR)" once serving; --port 0 binds a
free port and that line says which. SIGTERM or SIGINT stops it cleanly (exit code 0).
"""
from __future__ import annotations

import argparse
import sys

from broker.server import run_broker


def _parse_config_pairs(pairs: list[str] | None, parser: argparse.ArgumentParser) -> dict[str, str]:
    config: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            parser.error(f"--config expects NAME=VALUE, got {pair!r}")
        config[name.strip()] = value.strip()
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker", description="Run an eos broker.")
    parser.add_argument("--data-dir", default="./eos-data", help="where the logs live (default ./eos-data)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9092, help="port to bind; 0 picks a free one")
    parser.add_argument("--node-id", type=int, default=0)
    parser.add_argument("--config", action="append", metavar="NAME=VALUE",
                        help="broker config (Kafka names), repeatable")
    args = parser.parse_args(argv)
    return run_broker(args.data_dir, host=args.host, port=args.port, node_id=args.node_id,
                      config=_parse_config_pairs(args.config, parser))


if __name__ == "__main__":
    sys.exit(main())
