"""`eos configs`: client quotas, after kafka-configs.sh --entity-type users|clients.

    eos configs --alter --entity-type users --entity-name alice --add-config producer_byte_rate=1048576
    eos configs --alter --entity-type users --entity-default --add-config consumer_byte_rate=2097152
    eos configs --alter --entity-type users --entity-name alice --entity-type clients --entity-name app \\
        --add-config producer_byte_rate=524288
    eos configs --alter --entity-type clients --entity-name app --delete-config producer_byte_rate
    eos configs --describe [--entity-type users|clients]

Each --entity-type is paired, in order, with the --entity-name or --entity-default after it,
as kafka-configs pairs them. With an authorizer, --alter needs ALTER_CONFIGS on the cluster
and --describe DESCRIBE_CONFIGS.
"""
from __future__ import annotations

import sys

ENTITY_TYPES = {"users": "user", "clients": "client-id"}
DESCRIBED_AS = {"user": "user-principal", "client-id": "client-id"}


def _parse_pairs(text: str | None, option: str) -> dict[str, float | None]:
    changes: dict[str, float | None] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        if option == "--delete-config":
            changes[item] = None
            continue
        key, sep, value = item.partition("=")
        try:
            changes[key.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"error: {option} takes NAME=NUMBER[,NAME=NUMBER], got {item!r}") from None
        if not sep:
            raise SystemExit(f"error: {option} takes NAME=NUMBER[,NAME=NUMBER], got {item!r}")
    return changes


def _entity(args) -> dict:
    types = args.entity_type or []
    names = args.entity_names or []
    if not types or len(types) != len(names):
        raise SystemExit("error: each --entity-type needs an --entity-name or --entity-default after it")
    entity = {}
    for kind, name in zip(types, names):
        if ENTITY_TYPES[kind] in entity:
            raise SystemExit(f"error: --entity-type {kind} given twice")
        entity[ENTITY_TYPES[kind]] = name
    return entity


def cmd_configs(args) -> int:
    import eos
    from eos.cli import client_config

    with eos.Admin(bootstrap=args.bootstrap_server, config=client_config(args)) as admin:
        if args.alter:
            entity = _entity(args)
            changes = {**_parse_pairs(args.add_config, "--add-config"), **_parse_pairs(args.delete_config,
                                                                                      "--delete-config")}
            if not changes:
                print("error: --alter needs --add-config or --delete-config", file=sys.stderr)
                return 2
            admin.alter_client_quotas([(entity, changes)])
            print(f"Completed updating config for {_describe(entity)}.")
            return 0
        wanted = {ENTITY_TYPES[kind] for kind in (args.entity_type or [])}
        found = [(entity, values) for entity, values in admin.describe_client_quotas()
                 if not wanted or wanted <= set(entity)]
        if not found:
            print("No client quotas.")
        for entity, values in found:
            configs = ",".join(f"{key}={value}" for key, value in sorted(values.items()))
            print(f"Quota configs for {_describe(entity)} are {configs}")
    return 0


def _describe(entity: dict) -> str:
    return ", ".join(f"{DESCRIBED_AS[kind]} '{'<default>' if name in (None, '<default>') else name}'"
                     for kind, name in entity.items())


def add_commands(client_command) -> None:
    """Register `eos configs` on the `eos` parser."""
    configs = client_command("configs", help="client quotas of users and client ids (after kafka-configs.sh)")
    action = configs.add_mutually_exclusive_group(required=True)
    action.add_argument("--alter", action="store_true")
    action.add_argument("--describe", action="store_true")
    configs.add_argument("--entity-type", action="append", choices=sorted(ENTITY_TYPES),
                         help="users or clients; repeat with a name each for a user and client id together")
    configs.add_argument("--entity-name", action="append", dest="entity_names", metavar="NAME")
    configs.add_argument("--entity-default", action="append_const", const=None, dest="entity_names",
                         help="the default of the --entity-type before it")
    configs.add_argument("--add-config", metavar="K=V[,K=V]",
                         help="producer_byte_rate, consumer_byte_rate (bytes/s), request_percentage (%% of one thread)")
    configs.add_argument("--delete-config", metavar="K[,K]")
    configs.set_defaults(handler=cmd_configs)
