"""`eos configs`: topic configs, dynamic broker configs and client quotas, after
kafka-configs.sh --entity-type topics|brokers|users|clients.

    eos configs --describe --entity-type topics [--entity-name orders] [--all]
    eos configs --describe --entity-type brokers --entity-name 0 --all
    eos configs --alter --entity-type brokers --entity-default --add-config log.retention.ms=86400000
    eos configs --alter --entity-type brokers --entity-name 0 --delete-config log.segment.bytes
    eos configs --alter --entity-type topics --entity-name orders \\
        --add-config retention.ms=86400000,cleanup.policy=[compact,delete] --delete-config segment.bytes
    eos configs --alter --entity-type users --entity-name alice --add-config producer_byte_rate=1048576
    eos configs --alter --entity-type users --entity-default --add-config consumer_byte_rate=2097152
    eos configs --alter --entity-type users --entity-name alice --entity-type clients --entity-name app \\
        --add-config producer_byte_rate=524288
    eos configs --alter --entity-type clients --entity-name app --delete-config producer_byte_rate
    eos configs --describe [--entity-type users|clients]

Each --entity-type is paired, in order, with the --entity-name or --entity-default after it,
as kafka-configs pairs them. A topic's --describe lists its overrides (kafka-configs'
"Dynamic configs"), or with --all every config and where its value comes from; a value with
commas is written in brackets, as kafka-configs takes it. With an authorizer, topics need
ALTER_CONFIGS / DESCRIBE_CONFIGS on the topic, quotas the same on the cluster.
"""
from __future__ import annotations

import sys

ENTITY_TYPES = {"users": "user", "clients": "client-id"}
TOPICS = "topics"
BROKERS = "brokers"
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


def _parse_topic_configs(text: str | None) -> dict[str, str]:
    """kafka-configs' K=V[,K=V] for topics: a value holding commas is in brackets
    (cleanup.policy=[compact,delete])."""
    configs: dict[str, str] = {}
    depth, start, items = 0, 0, []
    text = text or ""
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    items.append(text[start:])
    for item in (i.strip() for i in items):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"error: --add-config takes K=V[,K=V] (a list value in brackets), got {item!r}")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        configs[key.strip()] = value
    return configs


def _one_name(args, kind: str) -> list[str]:
    names = [n for n in (args.entity_names or []) if n is not None]
    if len(args.entity_type) > 1 or len(args.entity_names or []) > 1 or (args.entity_names and not names):
        raise SystemExit(f"error: --entity-type {kind} takes one --entity-name (and no other entity type)")
    return names


def _broker_configs(admin, args) -> int:
    if len(args.entity_type) > 1 or len(args.entity_names or []) > 1:
        raise SystemExit(f"error: --entity-type {BROKERS} takes one --entity-name or --entity-default "
                         f"(and no other entity type)")
    default = args.entity_names == [None]       # --entity-default: every broker's
    names = [n for n in (args.entity_names or []) if n is not None]
    if args.alter:
        if not names and not default:
            raise SystemExit("error: --alter --entity-type brokers needs --entity-name or --entity-default")
        added, deleted = _alterations(args)
        admin.alter_broker_configs(None if default else int(names[0]), set=added, delete=deleted)
        print(f"Completed updating {'default config for brokers in the cluster' if default else f'config for broker {names[0]}'}.")
        return 0
    if default:
        _print_configs("Default configs for brokers in the cluster are:", admin.describe_broker_configs(None))
        return 0
    for name in names or [str(b) for b in sorted(admin.describe_cluster()["brokers"])]:
        configs = admin.describe_broker_configs(int(name))
        # kafka-configs' "Dynamic configs" of a broker: its own, not the cluster-wide ones
        dynamic = {k: v for k, v in configs.items() if v["source"] == "DYNAMIC_BROKER_CONFIG"}
        _print_configs(f"{'All' if args.all else 'Dynamic'} configs for broker {name} are:",
                       configs if args.all else dynamic)
    return 0


def _alterations(args) -> tuple[dict[str, str], list[str]]:
    """--add-config's {name: value} and --delete-config's names (a topic's or a broker's);
    exit 2 when neither is given."""
    added = _parse_topic_configs(args.add_config)
    deleted = [k.strip() for k in (args.delete_config or "").split(",") if k.strip()]
    if not added and not deleted:
        print("error: --alter needs --add-config or --delete-config", file=sys.stderr)
        raise SystemExit(2)
    return added, deleted


def _print_configs(title: str, configs: dict) -> None:
    print(title)
    for name, entry in sorted(configs.items()):
        print(f"  {name}={entry['value']} sensitive={str(entry['sensitive']).lower()} "
              f"synonyms={{{entry['source']}:{name}={entry['value']}}}")


def _topic_configs(admin, args) -> int:
    names = _one_name(args, TOPICS)
    if args.alter:
        if not names:
            raise SystemExit("error: --alter --entity-type topics needs --entity-name")
        added, deleted = _alterations(args)
        admin.incremental_alter_configs(names[0], set=added, delete=deleted)
        print(f"Completed updating config for topic {names[0]}.")
        return 0
    for topic in names or admin.list_topics():
        configs = admin.describe_configs(topic)
        _print_configs(f"{'All' if args.all else 'Dynamic'} configs for topic {topic} are:",
                       {k: v for k, v in configs.items() if args.all or v["source"] == "DYNAMIC_TOPIC_CONFIG"})
    return 0


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
        if TOPICS in (args.entity_type or []):
            return _topic_configs(admin, args)
        if BROKERS in (args.entity_type or []):
            return _broker_configs(admin, args)
        if args.all:
            raise SystemExit("error: --all describes topics or brokers (--entity-type topics|brokers)")
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
    configs = client_command("configs", help="topic configs and the client quotas of users and client ids "
                                             "(after kafka-configs.sh)")
    action = configs.add_mutually_exclusive_group(required=True)
    action.add_argument("--alter", action="store_true")
    action.add_argument("--describe", action="store_true")
    configs.add_argument("--entity-type", action="append", choices=sorted([*ENTITY_TYPES, TOPICS, BROKERS]),
                         help="topics, brokers, users or clients; repeat with a name each for a "
                              "user and client id together")
    configs.add_argument("--entity-name", action="append", dest="entity_names", metavar="NAME")
    configs.add_argument("--entity-default", action="append_const", const=None, dest="entity_names",
                         help="the default of the --entity-type before it")
    configs.add_argument("--add-config", metavar="K=V[,K=V]",
                         help="a topic's configs (retention.ms=86400000,cleanup.policy=[compact,delete]), a "
                              "broker's topic defaults (log.retention.ms=86400000), or "
                              "producer_byte_rate, consumer_byte_rate (bytes/s), request_percentage (%% of one thread)")
    configs.add_argument("--delete-config", metavar="K[,K]")
    configs.add_argument("--all", action="store_true",
                         help="with --describe of topics or brokers: every config and its source, not only the "
                              "dynamic ones")
    configs.set_defaults(handler=cmd_configs)
