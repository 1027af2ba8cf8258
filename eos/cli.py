"""The `eos` command line, after the habits of Kafka's tools.

    eos broker start [--data-dir DIR]... [--port N] [--zookeeper HOST:PORT --broker-id N [--rack R]] [--metrics-port N]
    eos broker health [--wait-ms N]         gRPC health: exit 0 once SERVING (logs and coordinators loaded)
    eos cluster start --brokers 3 --data-dir DIR    ZooKeeper and brokers on 127.0.0.1 (eos/cli_cluster.py)
    eos topics create|list|describe|delete ...   [--replication-factor N] [--under-replicated-partitions]
    eos topics adopt --topic T --from KAFKA_LOG_DIR --data-dir DIR    take over partitions Kafka wrote (offline, single broker)
    eos leader-election --election-type preferred|unclean ...
    eos partitions reassign --plan F --execute|--verify|--cancel
    eos produce TOPIC [--file F]            lines from stdin or a file, with a progress bar
    eos consume TOPIC [--from-beginning | --offset N] [--max-messages N]
    eos dump-log FILE...                     batches and index entries of segment files
    eos groups list|describe|offsets|delete|reset-offsets ...  consumer groups (eos/cli_groups.py)
    eos txn list|describe|abort|find-hanging transactions (after kafka-transactions.sh)
    eos acls --add|--list|--remove ...       ACLs, with kafka-acls.sh's flags
    eos users add|list|remove ...            SCRAM users (eos/cli_users.py)
    eos configs --alter|--describe ...       client quotas, kafka-configs.sh's flags (eos/cli_configs.py)
    eos delete-records --offset-json-file F  records before an offset go (eos/cli_records.py)
    eos console [--port 8080]                a web console of brokers, topics, groups, transactions (eos/console/)
    eos demo                                 the end-to-end demo on an embedded broker

Every client command takes --bootstrap-server (default $EOS_BOOTSTRAP or 127.0.0.1:9092) and,
as Kafka's tools, --command-config FILE: client settings in a properties file (e.g.
security.protocol=SSL, ssl.ca.location=ca.pem); --security-protocol, --ssl-*-location and
--sasl-mechanism/--sasl-username set the same and win over the file (a SASL password comes
from the file or $EOS_SASL_PASSWORD, never from a flag).
Errors print one line to stderr and exit 1; usage errors exit 2, as argparse does.
"""
from __future__ import annotations

import argparse
import os
import re
import struct
import sys
import time

DEFAULT_BOOTSTRAP = os.environ.get("EOS_BOOTSTRAP", "127.0.0.1:9092")


def _parse_config_pairs(pairs: list[str] | None) -> dict[str, str]:
    config = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"error: --config takes NAME=VALUE, got {pair!r}")
        config[name.strip()] = value.strip()
    return config


# ---- client settings (--command-config, --security-protocol, --ssl-*) -------------------------

_SECURITY_FLAGS = (("security_protocol", "security.protocol"), ("ssl_ca_location", "ssl.ca.location"),
                   ("ssl_certificate_location", "ssl.certificate.location"), ("ssl_key_location", "ssl.key.location"),
                   ("ssl_endpoint_identification_algorithm", "ssl.endpoint.identification.algorithm"),
                   ("sasl_mechanism", "sasl.mechanism"), ("sasl_username", "sasl.username"))


def read_properties(path: str) -> dict[str, str]:
    """A Java-style properties file (NAME=VALUE or NAME: VALUE lines, # and ! comments), as
    Kafka's tools read --command-config."""
    settings = {}
    with open(path, encoding="utf-8") as file:
        for number, raw in enumerate(file, 1):
            line = raw.strip()
            if not line or line[0] in "#!":
                continue
            match = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", line)
            if match is None:
                raise ValueError(f"{path}:{number}: expected NAME=VALUE, got {line!r}")
            settings[match.group(1)] = match.group(2).strip()
    return settings


def client_config(args) -> dict[str, str]:
    """The client settings a command was given: --command-config, then the flags over it."""
    config = read_properties(args.command_config) if getattr(args, "command_config", None) else {}
    for attribute, name in _SECURITY_FLAGS:
        value = getattr(args, attribute, None)
        if value is not None:
            config[name] = value
    if (str(config.get("security.protocol", "")).upper() == "SASL_SSL" and "sasl.password" not in config
            and os.environ.get("EOS_SASL_PASSWORD")):
        config["sasl.password"] = os.environ["EOS_SASL_PASSWORD"]   # not a flag: ps would show it
    return config


def add_client_arguments(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """--command-config and the security flags of a client command."""
    default = {"default": argparse.SUPPRESS} if suppress else {}
    parser.add_argument("--command-config", metavar="FILE", **default,
                        help="client settings in a properties file (Kafka's names, e.g. security.protocol=SSL)")
    parser.add_argument("--security-protocol", choices=["PLAINTEXT", "SSL", "SASL_SSL"], **default,
                        help="security.protocol")
    parser.add_argument("--sasl-mechanism", choices=["SCRAM-SHA-256", "SCRAM-SHA-512"], **default,
                        help="sasl.mechanism (default SCRAM-SHA-512)")
    parser.add_argument("--sasl-username", metavar="NAME", **default,
                        help="sasl.username; the password comes from --command-config (sasl.password) "
                             "or $EOS_SASL_PASSWORD")
    parser.add_argument("--ssl-ca-location", metavar="PEM", **default, help="ssl.ca.location: CA bundle to trust")
    parser.add_argument("--ssl-certificate-location", metavar="PEM", **default,
                        help="ssl.certificate.location: client certificate for mutual TLS")
    parser.add_argument("--ssl-key-location", metavar="PEM", **default, help="ssl.key.location: its private key")
    parser.add_argument("--ssl-endpoint-identification-algorithm", choices=["https", "none"], **default,
                        help="https (default) checks the broker's name in its certificate; none does not")


# ---- broker ----------------------------------------------------------------------------

def cmd_broker_start(args) -> int:
    from broker.server import run_broker
    config = _parse_config_pairs(args.config)
    if args.zookeeper:
        config["zookeeper.connect"] = args.zookeeper
    if args.rack:
        config["broker.rack"] = args.rack
    data_dirs = args.data_dir or ["./eos-data"]
    if len(data_dirs) > 1:
        config["log.dirs"] = ",".join(data_dirs)     # JBOD: the first keeps the broker's own files
    if args.allow_plaintext_remote:
        config["allow.plaintext.remote"] = "true"
    if args.metrics_port is not None:
        config["metrics.port"] = str(args.metrics_port)
    return run_broker(data_dirs[0], host=args.host, port=args.port, node_id=args.node_id, config=config)


def cmd_broker_health(args) -> int:
    """gRPC's standard health check of one broker: exit 0 when SERVING. With --wait-ms, ask
    again (every 200 ms) until it is SERVING or the time is up, as a start-up probe does."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from eos.client_config import security_of
    from eos.net import open_channel

    channel = open_channel(args.bootstrap_server, security_of(client_config(args)))
    stub = health_pb2_grpc.HealthStub(channel)
    deadline_s = time.monotonic() + args.wait_ms / 1000.0
    try:
        while True:
            try:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(stub.Check(
                    health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout_ms / 1000.0).status)
            except grpc.RpcError as exc:
                status = f"unreachable ({exc.code().name}: {exc.details()})"
            if status == "SERVING" or time.monotonic() >= deadline_s:
                break
            time.sleep(0.2)
    finally:
        channel.close()
    print(f"{args.bootstrap_server}{' ' + args.service if args.service else ''}: {status}", flush=True)
    return 0 if status == "SERVING" else 1


# ---- topics ----------------------------------------------------------------------------

def cmd_topics(args) -> int:
    if args.action == "adopt":
        return _adopt(args)
    import eos
    with eos.Admin(bootstrap=args.bootstrap_server, config=client_config(args)) as admin:
        if args.action == "create":
            admin.create_topic(args.topic, partitions=args.partitions if args.partitions is not None else 1,
                               replication_factor=args.replication_factor,
                               config=_parse_config_pairs(args.config))
            print(f"Created topic {args.topic}.")
        elif args.action == "list":
            for name in sorted(admin.list_topics()):
                print(name)
        elif args.action == "alter":
            if args.partitions is None:
                print("error: topics alter needs --partitions (the new total; configs: eos configs --alter)",
                      file=sys.stderr)
                return 2
            admin.create_partitions(args.topic, args.partitions)
            print("WARNING: If partitions are increased for a topic that has a key, the partition logic or "
                  "ordering of the messages will be affected\nAdding partitions succeeded!")
        elif args.action == "delete":
            admin.delete_topic(args.topic)
            print(f"Deleted topic {args.topic}.")
        elif args.action == "describe":
            names = [args.topic] if args.topic else sorted(admin.list_topics())
            for name in names:
                _print_topic(admin.describe_topic(name), under_replicated=args.under_replicated_partitions,
                             unavailable=args.unavailable_partitions)
    return 0


def _adopt(args) -> int:
    """Offline: take over a topic's partition directories from an Apache Kafka log dir."""
    from broker.adopt import adopt_topic
    if not args.kafka_log_dir or not args.data_dir:
        print("error: topics adopt needs --from KAFKA_LOG_DIR and --data-dir EOS_DATA_DIR "
              "(of a stopped broker)", file=sys.stderr)
        return 2
    adopted = adopt_topic(args.kafka_log_dir, args.topic, args.data_dir, config=_parse_config_pairs(args.config),
                          now_ms=int(time.time() * 1000), progress=lambda message: print(f"  {message}"))
    for check in adopted.partitions:
        print(f"  {adopted.topic}-{check.partition}: {check.segments} segment(s), {check.batches:,} batches, "
              f"log end offset {check.log_end_offset:,}")
    print(f"Adopted topic {adopted.topic} ({len(adopted.partitions)} partition(s)); new producer ids start at "
          f"{adopted.next_producer_id}. Start the broker on {args.data_dir} to serve it.")
    return 0


def _print_topic(description: dict, *, under_replicated: bool = False, unavailable: bool = False) -> None:
    """kafka-topics --describe: a topic line, then a line per partition. With
    --under-replicated-partitions (ISR smaller than the replicas) or --unavailable-partitions
    (no leader), only the matching partition lines, and no topic line."""
    configs = ",".join(f"{k}={v}" for k, v in sorted(description.get("configs", {}).items()))
    partitions = description["partitions"]
    filtered = under_replicated or unavailable
    if filtered:
        partitions = [p for p in partitions
                      if (under_replicated and len(p["isr"]) < len(p["replicas"]))
                      or (unavailable and p["leader"] < 0)]
    else:
        print(f"Topic: {description['name']}\tPartitionCount: {len(partitions)}\t"
              f"ReplicationFactor: {len(partitions[0]['replicas']) if partitions else 0}\tConfigs: {configs}")
    for p in partitions:
        leader = p["leader"] if p["leader"] >= 0 else "none"
        line = (f"\tTopic: {description['name']}\tPartition: {p['partition']}\tLeader: {leader}\t"
                f"Replicas: {','.join(map(str, p['replicas']))}\tIsr: {','.join(map(str, p['isr']))}")
        offline = p.get("offline_replicas") or []
        if offline:
            line += f"\tOffline: {','.join(map(str, offline))}"
        print(line)


# ---- produce / consume -------------------------------------------------------------------

def cmd_produce(args) -> int:
    import eos
    from eos.progress import ProgressBar

    source = open(args.file, "rb") if args.file else sys.stdin.buffer
    total = None
    if args.file:
        with open(args.file, "rb") as counting:
            total = sum(1 for _ in counting)
    separator = args.key_separator.encode() if args.key_separator else None
    failures = []

    def on_delivery(_metadata, error):  # Kafka's (metadata, exception) order
        if error is not None:
            failures.append(error)

    producer = eos.Producer(bootstrap=args.bootstrap_server, config=client_config(args), acks=args.acks,
                            compression_type=args.compression_type, linger_ms=args.linger_ms,
                            max_block_ms=args.max_block_ms)
    sent = 0
    with ProgressBar(total, f"produce {args.topic}") as bar:
        try:
            for line in source:
                line = line.rstrip(b"\r\n")
                key = None
                if separator is not None:
                    key, _, line = line.partition(separator)
                producer.send(args.topic, value=line, key=key, on_delivery=on_delivery)
                sent += 1
                bar.advance()
            producer.flush()
        finally:
            producer.close()
            if source is not sys.stdin.buffer:
                source.close()
    if failures:
        print(f"error: {len(failures)} of {sent} records failed: {failures[0]}", file=sys.stderr)
        return 1
    print(f"Produced {sent} records to {args.topic}.", file=sys.stderr)
    return 0


def cmd_consume(args) -> int:
    import eos
    from eos import TopicPartition

    consumer = eos.Consumer(bootstrap=args.bootstrap_server, config=client_config(args), group_id=None,
                            isolation_level=args.isolation,
                            auto_offset_reset="earliest" if args.from_beginning else "latest")
    try:
        with eos.Admin(bootstrap=args.bootstrap_server, config=client_config(args)) as admin:
            partitions = [p["partition"] for p in admin.describe_topic(args.topic)["partitions"]]
        if args.partition is not None:
            partitions = [args.partition]
        tps = [TopicPartition(args.topic, p) for p in partitions]
        consumer.assign(tps)
        if args.offset is not None:
            for tp in tps:
                consumer.seek(tp, args.offset)
        elif args.from_beginning:
            consumer.seek_to_beginning(*tps)
        shown = 0
        idle_deadline_s = time.monotonic() + args.timeout_ms / 1000
        out = sys.stdout.buffer
        while args.max_messages is None or shown < args.max_messages:
            records = consumer.poll(timeout_ms=200)
            if not records:
                if time.monotonic() >= idle_deadline_s:
                    break
                continue
            idle_deadline_s = time.monotonic() + args.timeout_ms / 1000
            for record in records:
                if args.max_messages is not None and shown >= args.max_messages:
                    break
                line = record.value or b""
                if args.print_key:
                    line = (record.key or b"null") + b"\t" + line
                if args.print_offset:
                    line = f"{record.partition}:{record.offset}\t".encode() + line
                out.write(line + b"\n")
                shown += 1
        out.flush()
        print(f"Processed a total of {shown} messages", file=sys.stderr)
    finally:
        consumer.close()
    return 0


# ---- dump-log -------------------------------------------------------------------------------

def cmd_dump_log(args) -> int:
    for path in args.files:
        print(f"Dumping {path}")
        if path.endswith(".log"):
            _dump_segment(path, args.print_data_log)
        elif path.endswith(".index"):
            _dump_fixed(path, struct.Struct(">II"), lambda r, base: f"offset: {base + r[0]} position: {r[1]}")
        elif path.endswith(".timeindex"):
            _dump_fixed(path, struct.Struct(">qI"), lambda r, base: f"timestamp: {r[0]} offset: {base + r[1]}")
        elif path.endswith(".snapshot"):
            _dump_snapshot(path)
        elif path.endswith(".txnindex"):
            _dump_txn_index(path)
        else:
            print(f"error: {path}: not a .log, .index, .timeindex, .txnindex or .snapshot file", file=sys.stderr)
            return 1
    return 0


def _base_offset_of(path: str) -> int:
    try:
        return int(os.path.basename(path).split(".")[0])
    except ValueError:
        return 0


def _dump_fixed(path: str, entry: struct.Struct, describe) -> None:
    base = _base_offset_of(path)
    with open(path, "rb") as f:
        data = f.read()
    for position in range(0, len(data) - entry.size + 1, entry.size):
        fields = entry.unpack_from(data, position)
        if not any(fields):  # preallocated zero tail
            break
        print(describe(fields, base))


def _dump_segment(path: str, print_data: bool) -> None:
    from eos.errors import CorruptRecordError
    from eos.records import header as batch_header
    from eos.records.codec import decode_control_record, decode_records

    with open(path, "rb") as f:
        data = f.read()
    position = 0
    try:
        for h in batch_header.iter_headers(data):
            crc_ok = batch_header.compute_crc(data, h.position, h.size_bytes) == h.crc
            print(f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
                  f"baseSequence: {h.base_sequence} lastSequence: {h.last_sequence} producerId: {h.producer_id} "
                  f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
                  f"isTransactional: {str(h.is_transactional).lower()} isControl: {str(h.is_control).lower()} "
                  f"position: {h.position} CreateTime: {h.max_timestamp} size: {h.size_bytes} "
                  f"magic: {h.magic} compresscodec: {_codec_name(h.compression)} crc: {h.crc} isvalid: {str(crc_ok).lower()}")
            if print_data and crc_ok:
                if h.is_control:
                    marker, coordinator_epoch = decode_control_record(data, h)
                    print(f"| offset: {h.base_offset} endTxnMarker: {'COMMIT' if marker == 1 else 'ABORT'} "
                          f"coordinatorEpoch: {coordinator_epoch}")
                else:
                    for r in decode_records(data, h, "", 0):
                        print(f"| offset: {r.offset} CreateTime: {r.timestamp} keySize: {_size(r.key)} "
                              f"valueSize: {_size(r.value)} key: {_show(r.key)} payload: {_show(r.value)}")
            position = h.position + h.size_bytes
    except CorruptRecordError as e:
        print(f"Found {len(data) - position} invalid bytes at position {position}: {e}")


def _codec_name(codec: int) -> str:
    from eos.records.compression import codec_name
    try:
        return codec_name(codec)
    except Exception:
        return f"unknown({codec})"


def _size(b: bytes | None) -> int:
    return -1 if b is None else len(b)


def _show(b: bytes | None) -> str:
    return "null" if b is None else b.decode("utf-8", "backslashreplace")


def _dump_txn_index(path: str) -> None:
    from broker.storage.txn_index import read_txn_index_file
    for entry in read_txn_index_file(path):
        print(f"version: 0 producerId: {entry.producer_id} firstOffset: {entry.first_offset} "
              f"lastOffset: {entry.last_offset} lastStableOffset: {entry.last_stable_offset}")


def _dump_snapshot(path: str) -> None:
    from broker.storage import producer_state
    for entry in producer_state.read_snapshot_file(path):
        print(" ".join(f"{k}: {v}" for k, v in entry.items()))


# ---- tables -------------------------------------------------------------------------------

def _cell(value) -> str:
    return "-" if value is None or value == "" else str(value)


def _print_table(headers: list[str], rows: list[list]) -> None:
    """Columns padded to their widest cell, as Kafka's tools print them; None shows as "-"."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    for row in [headers] + cells:
        print(" ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip())


# ---- transactions ---------------------------------------------------------------------------

def cmd_txn(args) -> int:
    """kafka-transactions.sh's subcommands, with its columns in its order (a script that reads
    Kafka's output reads eos's)."""
    import eos
    with eos.Admin(bootstrap=args.bootstrap_server, config=client_config(args)) as admin:
        if args.action == "list":
            listed = admin.list_transactions(states=args.state, duration_ms=args.duration_filter)
            _print_table(["TransactionalId", "Coordinator", "ProducerId", "TransactionState"],
                         [[t["transactional_id"], t["coordinator_id"], t["producer_id"], t["state"]] for t in listed])
        elif args.action == "describe":
            return _txn_describe(admin, args)
        elif args.action == "describe-producers":
            from eos import TopicPartition
            tp = TopicPartition(args.topic, args.partition)
            producers = admin.describe_producers([tp]).get(tp, [])
            _print_table(["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                          "CurrentTransactionStartOffset"],
                         [[p["producer_id"], p["producer_epoch"], p["coordinator_epoch"], p["last_sequence"],
                           p["last_timestamp_ms"],
                           p["current_txn_start_offset"] if p["current_txn_start_offset"] >= 0 else "None"]
                          for p in producers])
        elif args.action == "abort":
            return _txn_abort(admin, args)
        elif args.action == "find-hanging":
            if args.topic is None and args.broker_id is None:
                print("error: the `find-hanging` command requires either --topic or --broker-id to limit the scope "
                      "of the search", file=sys.stderr)
                return 2
            if args.partition is not None and args.topic is None:
                print("error: the --partition argument requires --topic to be provided", file=sys.stderr)
                return 2
            from eos import TopicPartition
            hanging = admin.find_hanging_transactions(
                args.topic, broker_id=args.broker_id,
                partitions=None if args.partition is None else [TopicPartition(args.topic, args.partition)],
                max_duration_ms=int(args.max_transaction_timeout * 60_000))
            _print_table(["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                          "LastTimestamp", "Duration(min)"],
                         [[h["topic"], h["partition"], h["producer_id"], h["producer_epoch"], h["coordinator_epoch"],
                           h["start_offset"], h["last_timestamp_ms"], h["duration_ms"] // 60_000] for h in hanging])
    return 0


def _txn_describe(admin, args) -> int:
    transactional_id = args.transactional_id_flag or args.transactional_id
    if not transactional_id:
        print("error: eos txn describe needs --transactional-id", file=sys.stderr)
        return 2
    t = admin.describe_transaction(transactional_id)
    now_ms = int(time.time() * 1000)
    started_ms = t["start_time_ms"]
    _print_table(["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                  "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs", "TopicPartitions"],
                 [[t["coordinator_id"], t["transactional_id"], t["producer_id"], t["producer_epoch"], t["state"],
                   t["timeout_ms"], "None" if started_ms is None else started_ms,
                   "None" if started_ms is None else now_ms - started_ms,
                   ",".join(f"{tp.topic}-{tp.partition}" for tp in t["partitions"])]])
    if t["participants"]:
        # eos's own: the producers writing into this transaction besides its owner
        print()
        _print_table(["ParticipantProducerId", "ProducerEpoch", "Accepted", "TopicPartitions"],
                     [[p["producer_id"], p["producer_epoch"], str(p["accepted"]).lower(),
                       ",".join(f"{tp.topic}-{tp.partition}" for tp in p["partitions"])]
                      for p in t["participants"]])
    return 0


def _txn_abort(admin, args) -> int:
    from eos import TopicPartition
    if args.topic is None or args.partition is None:
        print("error: eos txn abort needs --topic and --partition", file=sys.stderr)
        return 2
    tp = TopicPartition(args.topic, args.partition)
    ids = (args.producer_id, args.producer_epoch, args.coordinator_epoch)
    if args.start_offset is not None:
        if any(v is not None for v in ids):
            print("error: give either --start-offset or --producer-id/--producer-epoch/--coordinator-epoch",
                  file=sys.stderr)
            return 2
        # kafka-transactions.sh abort --start-offset: the producer whose open transaction starts there.
        found = [p for p in admin.describe_producers([tp]).get(tp, [])
                 if p["current_txn_start_offset"] == args.start_offset]
        if not found:
            print(f"error: no open transaction starts at offset {args.start_offset} in {tp.topic}-{tp.partition}",
                  file=sys.stderr)
            return 1
        producer = found[0]
        ids = (producer["producer_id"], producer["producer_epoch"], producer["coordinator_epoch"])
    elif any(v is None for v in ids):
        print("error: eos txn abort needs --producer-id, --producer-epoch and --coordinator-epoch "
              "(or --start-offset)", file=sys.stderr)
        return 2
    admin.abort_transaction(tp, *ids)
    print(f"Aborted the transaction of producer {ids[0]} (epoch {ids[1]}) in {tp.topic}-{tp.partition}.")
    return 0


# ---- ACLs (after kafka-acls.sh) ----------------------------------------------------------------

def _acl_resources(args, default_pattern: str) -> list[tuple[int, str, int]]:
    """(resource type, name, pattern type) for each --topic/--group/--transactional-id/--cluster."""
    from eos.acl import CLUSTER_NAME, PatternType, ResourceType
    pattern = PatternType[(args.resource_pattern_type or default_pattern).upper()]
    resources = [(ResourceType.TOPIC, name, pattern) for name in args.topic or ()]
    resources += [(ResourceType.GROUP, name, pattern) for name in args.group or ()]
    resources += [(ResourceType.TRANSACTIONAL_ID, name, pattern) for name in args.transactional_id or ()]
    if args.cluster:
        resources.append((ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL
                          if pattern in (PatternType.PREFIXED,) else pattern))
    return resources


def _acl_entries(args) -> list[tuple[str, str, int, int]]:
    """(principal, host, operation, permission) for each principal x operation given."""
    from eos.acl import Permission, parse_operation
    operations = [parse_operation(o) for o in args.operation or ["All"]]
    allow_host = args.allow_host or args.host or "*"
    deny_host = args.deny_host or args.host or "*"
    entries = [(p, allow_host, o, Permission.ALLOW) for p in args.allow_principal or () for o in operations]
    entries += [(p, deny_host, o, Permission.DENY) for p in args.deny_principal or () for o in operations]
    return entries


def _print_acls(title: str, bindings) -> None:
    by_resource: dict = {}
    for b in bindings:
        by_resource.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(b)
    for (resource_type, name, pattern), found in sorted(by_resource.items()):
        print(f"{title} `ResourcePattern(resourceType={resource_type.name}, name={name}, "
              f"patternType={pattern.name})`:")
        for b in sorted(found):
            print(f" \t(principal={b.principal}, host={b.host}, operation={b.operation.name}, "
                  f"permissionType={b.permission.name})")
        print()


def cmd_acls(args) -> int:
    import eos
    from eos.acl import AclBinding, AclFilter, InvalidAclError, Operation, PatternType, Permission, ResourceType
    try:
        with eos.Admin(bootstrap=args.bootstrap_server, config=client_config(args)) as admin:
            if args.add:
                resources, entries = _acl_resources(args, "literal"), _acl_entries(args)
                if not resources or not entries:
                    print("error: --add needs a resource (--topic, --group, --transactional-id or --cluster) and "
                          "--allow-principal or --deny-principal", file=sys.stderr)
                    return 2
                bindings = [AclBinding(rt, name, pt, principal, host, op, perm)
                            for rt, name, pt in resources for principal, host, op, perm in entries]
                admin.create_acls(bindings)
                _print_acls("Adding ACLs for resource", bindings)
            elif args.remove:
                resources = _acl_resources(args, "literal")
                if not resources:
                    print("error: --remove needs a resource (--topic, --group, --transactional-id or --cluster)",
                          file=sys.stderr)
                    return 2
                if args.allow_principal or args.deny_principal:
                    filters = [AclFilter(rt, name, pt, principal, host, op, perm)
                               for rt, name, pt in resources for principal, host, op, perm in _acl_entries(args)]
                else:   # kafka-acls.sh: no principal named removes every ACL of the resource
                    filters = [AclFilter(rt, name, pt, operation=Operation.ANY, permission=Permission.ANY)
                               for rt, name, pt in resources]
                removed = admin.delete_acls(filters)
                _print_acls("Removed ACLs for resource", removed)
                if not removed:
                    print("No ACL matched.")
            else:   # --list
                resources = _acl_resources(args, "any") or [(ResourceType.ANY, None, PatternType.ANY)]
                found = []
                for rt, name, pt in resources:
                    found.extend(admin.describe_acls(AclFilter(rt, name, pt, principal=args.principal)))
                _print_acls("Current ACLs for resource", sorted(set(found)))
    except InvalidAclError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


# ---- demo -----------------------------------------------------------------------------------

def cmd_demo(args) -> int:
    from eos.demo import run_demo
    return run_demo(records=args.records, keep_data=args.keep_data, brokers=args.brokers)


# ---- parser ---------------------------------------------------------------------------------

def _add_broker_command(commands) -> None:
    """eos broker start."""
    broker = commands.add_parser("broker", help="run a broker")
    broker_actions = broker.add_subparsers(dest="action", required=True)
    start = broker_actions.add_parser("start", help="start an embedded broker in the foreground")
    start.add_argument("--data-dir", action="append", metavar="DIR",
                       help="a log directory (default ./eos-data); repeat it for several disks (Kafka's log.dirs): "
                            "new partitions go to the one with the fewest")
    start.add_argument("--host", default="127.0.0.1")
    start.add_argument("--port", type=int, default=9092)
    start.add_argument("--node-id", "--broker-id", dest="node_id", type=int, default=0)
    start.add_argument("--zookeeper", metavar="HOST:PORT[/CHROOT]",
                       help="join the cluster coordinated by this ZooKeeper (zookeeper.connect)")
    start.add_argument("--rack", help="broker.rack, for rack-aware replica assignment")
    start.add_argument("--config", action="append", metavar="NAME=VALUE",
                       help="broker config override, e.g. listeners=PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093 "
                            "(with ssl.certificate.location, ssl.key.location, ssl.ca.location, ssl.client.auth)")
    start.add_argument("--allow-plaintext-remote", action="store_true",
                       help="allow a PLAINTEXT listener on an address other machines can reach "
                            "(allow.plaintext.remote=true; refused by default)")
    start.add_argument("--metrics-port", type=int, metavar="PORT",
                       help="serve Prometheus metrics at http://HOST:PORT/metrics (metrics.port; off by default)")
    start.set_defaults(handler=cmd_broker_start)
    health = broker_actions.add_parser("health", help="gRPC health check: SERVING once the broker's logs and "
                                                      "coordinators are loaded (exit 0), else exit 1")
    health.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP, help="host:port of the broker")
    health.add_argument("--service", default="", help="one service (e.g. eos.v1.Broker); default: the broker")
    health.add_argument("--wait-ms", type=int, default=0, help="ask again until SERVING, for up to this long")
    health.add_argument("--timeout-ms", type=int, default=5000, help="each check's deadline")
    add_client_arguments(health)
    health.set_defaults(handler=cmd_broker_health)


def _add_topics_command(client_command) -> None:
    """eos topics create|list|describe|alter|delete|adopt (after kafka-topics.sh)."""
    topics = client_command("topics", help="create, list, describe, alter (add partitions), delete topics; "
                                           "adopt Kafka's partitions")
    topics.add_argument("action", choices=["create", "list", "describe", "alter", "delete", "adopt"])
    topics.add_argument("topic", nargs="?")
    topics.add_argument("--partitions", type=int, help="create: the count (default 1); alter: the new total")
    topics.add_argument("--replication-factor", type=int, default=1)
    topics.add_argument("--config", action="append", metavar="NAME=VALUE", help="topic config")
    topics.add_argument("--under-replicated-partitions", action="store_true",
                        help="describe: only partitions whose ISR is smaller than their replicas")
    topics.add_argument("--unavailable-partitions", action="store_true",
                        help="describe: only partitions without a leader")
    topics.add_argument("--topic", dest="topic_flag", metavar="TOPIC", help="the topic, as kafka-topics spells it")
    topics.add_argument("--from", dest="kafka_log_dir", metavar="KAFKA_LOG_DIR",
                        help="adopt: the log dir of a cleanly stopped Apache Kafka broker holding TOPIC-0, ... "
                             "(v2 segments, Kafka 0.11 and later: v0/v1 message sets are refused)")
    topics.add_argument("--data-dir",
                        help="adopt: the data dir of the stopped single eos broker that takes the topic over. Not a "
                             "ZooKeeper cluster broker's: its data dir looks like a single broker's, so adopt cannot "
                             "tell and does not refuse it, but the controller would not know the topic and the "
                             "cluster's producer ids (from ZooKeeper) would not move past Kafka's")
    topics.set_defaults(handler=cmd_topics)


def _add_data_commands(commands, client_command) -> None:
    """eos produce, consume and dump-log."""
    produce = client_command("produce", help="produce lines from stdin or a file")
    produce.add_argument("topic")
    produce.add_argument("--file")
    produce.add_argument("--key-separator", help="split each line into key and value at this string")
    produce.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"])
    produce.add_argument("--compression-type", default="none",
                         choices=["none", "gzip", "snappy", "lz4", "zstd"])
    produce.add_argument("--linger-ms", type=int, default=5)
    produce.add_argument("--max-block-ms", type=int, default=60000,
                         help="how long a send may wait for metadata (an unknown topic fails after this)")
    produce.set_defaults(handler=cmd_produce)

    consume = client_command("consume", help="print records of a topic")
    consume.add_argument("topic")
    start_at = consume.add_mutually_exclusive_group()
    start_at.add_argument("--from-beginning", action="store_true")
    start_at.add_argument("--offset", type=int)
    consume.add_argument("--partition", type=int)
    consume.add_argument("--max-messages", type=int)
    consume.add_argument("--isolation", default="read_uncommitted",
                         choices=["read_uncommitted", "read_committed"])
    consume.add_argument("--timeout-ms", type=int, default=2000,
                         help="stop after this long without new records")
    consume.add_argument("--print-key", action="store_true")
    consume.add_argument("--print-offset", action="store_true")
    consume.set_defaults(handler=cmd_consume)

    dump = commands.add_parser("dump-log", help="print the batches or entries of segment files")
    dump.add_argument("files", nargs="+")
    dump.add_argument("--print-data-log", action="store_true", help="also print each record")
    dump.set_defaults(handler=cmd_dump_log)


def _add_txn_command(client_command) -> None:
    """eos txn (after kafka-transactions.sh)."""
    txn = client_command("txn", help="list, describe, describe-producers, abort and find hanging transactions")
    txn_actions = txn.add_subparsers(dest="action", required=True)
    txn_list = txn_actions.add_parser("list", help="every transactional id the coordinators know (every broker asked)")
    txn_list.add_argument("--state", action="append", metavar="STATE", help="only this state (repeatable)")
    txn_list.add_argument("--duration-filter", type=int, metavar="MS",
                          help="only transactions open longer than this many ms")
    txn_describe = txn_actions.add_parser("describe", help="one transactional id")
    txn_describe.add_argument("--transactional-id", dest="transactional_id_flag", metavar="ID")
    txn_describe.add_argument("transactional_id", nargs="?", help="the id, as --transactional-id gives it")
    txn_producers = txn_actions.add_parser("describe-producers",
                                           help="the active producers of a partition (at its leader)")
    txn_producers.add_argument("--topic", required=True)
    txn_producers.add_argument("--partition", type=int, required=True)
    txn_abort = txn_actions.add_parser("abort", help="write an ABORT marker for a hanging transaction (KIP-664)")
    txn_abort.add_argument("--topic")
    txn_abort.add_argument("--partition", type=int)
    txn_abort.add_argument("--producer-id", type=int)
    txn_abort.add_argument("--producer-epoch", type=int)
    txn_abort.add_argument("--coordinator-epoch", type=int)
    txn_abort.add_argument("--start-offset", type=int, help="instead of the ids: the open transaction starting here")
    txn_hanging = txn_actions.add_parser("find-hanging", help="open transactions no coordinator accounts for")
    txn_hanging.add_argument("--topic", help="the topic to search (or --broker-id)")
    txn_hanging.add_argument("--partition", type=int, help="only this partition of --topic")
    txn_hanging.add_argument("--broker-id", type=int, help="the partitions with a replica on this broker")
    txn_hanging.add_argument("--max-transaction-timeout", type=float, default=15.0, metavar="MINUTES",
                             help="only transactions without a write for this long (default 15, the broker maximum)")
    for sub in (txn_list, txn_describe, txn_producers, txn_abort, txn_hanging):
        sub.add_argument("--bootstrap-server", default=argparse.SUPPRESS, help="host:port of a broker")
        add_client_arguments(sub, suppress=True)
    txn.set_defaults(handler=cmd_txn)


def _add_acls_command(client_command) -> None:
    """eos acls (after kafka-acls.sh)."""
    acls = client_command("acls", help="add, list and remove ACLs (after kafka-acls.sh)")
    action = acls.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true", help="add the ACLs the other flags describe")
    action.add_argument("--list", action="store_true", help="list ACLs (of the resources named, else all)")
    action.add_argument("--remove", action="store_true",
                        help="remove the ACLs the other flags describe (every ACL of the resource without a principal)")
    acls.add_argument("--allow-principal", action="append", metavar="User:NAME", help="repeatable; User:* for anyone")
    acls.add_argument("--deny-principal", action="append", metavar="User:NAME", help="repeatable")
    acls.add_argument("--principal", metavar="User:NAME", help="--list: only this principal's ACLs")
    acls.add_argument("--allow-host", metavar="IP", help="the host the allow ACLs apply to (default *)")
    acls.add_argument("--deny-host", metavar="IP", help="the host the deny ACLs apply to (default *)")
    acls.add_argument("--host", metavar="IP", help="both --allow-host and --deny-host")
    acls.add_argument("--operation", action="append", metavar="OP",
                      help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
                           "AlterConfigs, IdempotentWrite or All (default All); repeatable")
    acls.add_argument("--topic", action="append", metavar="NAME", help="a topic (* for every topic); repeatable")
    acls.add_argument("--group", action="append", metavar="NAME", help="a consumer group; repeatable")
    acls.add_argument("--transactional-id", action="append", metavar="ID", help="a transactional id; repeatable")
    acls.add_argument("--cluster", action="store_true", help="the cluster resource")
    acls.add_argument("--resource-pattern-type", choices=["literal", "prefixed", "any", "match"],
                      help="literal (default for --add/--remove), prefixed, or for --list/--remove any or match")
    acls.add_argument("--force", action="store_true", help="accepted for kafka-acls.sh compatibility (eos never asks)")
    acls.set_defaults(handler=cmd_acls)


def _add_demo_command(commands) -> None:
    """eos demo."""
    demo = commands.add_parser("demo", help="run the end-to-end demo on an embedded broker")
    demo.add_argument("--records", type=int, default=200_000)
    demo.add_argument("--keep-data", action="store_true")
    demo.add_argument("--brokers", type=int, default=1,
                      help="1: an embedded broker (default); 3: a local 3-broker cluster with ZooKeeper, and one of "
                           "its brokers killed with SIGKILL mid-transaction too")
    demo.set_defaults(handler=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eos", description="eos: exactly-once streaming for PySpark")
    commands = parser.add_subparsers(dest="command", required=True)

    def client_command(name: str, **kwargs) -> argparse.ArgumentParser:
        p = commands.add_parser(name, **kwargs)
        p.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP, help="host:port of a broker")
        add_client_arguments(p)
        return p

    _add_broker_command(commands)
    _add_topics_command(client_command)
    from eos.cli_cluster import add_commands as add_cluster_commands
    add_cluster_commands(commands, client_command, _parse_config_pairs)
    _add_data_commands(commands, client_command)
    from eos.cli_groups import add_commands as add_groups_commands
    add_groups_commands(client_command)
    _add_txn_command(client_command)
    _add_acls_command(client_command)
    from eos.cli_users import add_commands as add_users_commands
    add_users_commands(commands, client_command)
    from eos.cli_configs import add_commands as add_configs_commands
    add_configs_commands(client_command)
    from eos.cli_records import add_commands as add_records_commands
    add_records_commands(client_command)
    from eos.console.cli import add_commands as add_console_commands   # eos console: the web console
    add_console_commands(commands, add_client_arguments, DEFAULT_BOOTSTRAP)
    _add_demo_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "topics" and not args.topic:
        args.topic = args.topic_flag
    named = ("create", "alter", "delete", "adopt")
    if args.command == "topics" and getattr(args, "action", None) in named and not args.topic:
        print("error: a topic name is required", file=sys.stderr)
        return 2
    from eos.errors import EosError
    try:
        return args.handler(args) or 0
    except EosError as e:
        print(f"error: {e.code.name}: {e}", file=sys.stderr)
        return 1
    except ValueError as e:   # bad input the client refused before sending (an unknown state name, ...)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`eos consume ... | head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:      # a file that is not there or cannot be read
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
