"""Broker config: Kafka's broker setting names, parsed once into a typed `BrokerConfig`.

Theory of operation
-------------------
`BrokerConfig.from_dict` takes the settings as Kafka spells them (`num.partitions`,
`log.retention.hours`, `listeners`, `authorizer.class.name`, ...) as strings, checks every
one, and returns a frozen dataclass whose fields swap dots for underscores. The broker-level
defaults of topic configs keep Kafka's broker spelling (`log.segment.bytes`,
`message.max.bytes`, ...) and become the base every topic's overrides apply to; the coarse
time forms follow Kafka's precedence (`.ms` over `.minutes` over `.hours`). An unknown name
or a bad value is an InvalidConfigError naming it, never a silent default. No I/O: files
named here (certificates, ACLs) are read when the broker starts.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

from broker.acl import InvalidAclError, parse_super_users
from broker.authorizer import AUTHORIZER_CLASS_NAMES
from broker.group.offsets import OFFSET_METADATA_MAX_BYTES
from broker.group.records import OFFSETS_TOPIC_PARTITIONS
from broker.quotas import QUOTA_WINDOW_NUM, QUOTA_WINDOW_SIZE_MS
from broker.group.state import (GROUP_INITIAL_REBALANCE_DELAY_MS, GROUP_MAX_SESSION_TIMEOUT_MS, GROUP_MAX_SIZE,
                                GROUP_MIN_SESSION_TIMEOUT_MS)
from broker.security import (CLIENT_AUTH_VALUES, PLAINTEXT, SSL, Listener, PrincipalRule, parse_listeners,
                             parse_principal_mapping_rules, parse_protocol_map, transport_of)
from eos.config import TopicConfig
from eos.errors import InvalidConfigError
from eos.scram import MECHANISMS as SCRAM_MECHANISMS

REAUTH_MS_MIN = 10_000

MIB = 1024 * 1024
GRPC_MESSAGE_BYTES_MAX = 100 * MIB
# num.io.threads: the workers only short calls can take (Kafka's request handler threads;
# Kafka's default is 8, eos's 16 because a Python handler holds its worker for the whole
# call, fsync and replication wait included, where Kafka's hands those to purgatory).
RPC_WORKERS_FOR_SHORT_CALLS = 16
QUEUED_MAX_REQUESTS = 500          # Kafka's queued.max.requests default

# Kafka broker-level names of topic config defaults -> the topic-level name they set.
_TOPIC_DEFAULT_NAMES = {
    "log.segment.bytes": "segment.bytes",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.retention.bytes": "retention.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "message.max.bytes": "max.message.bytes",
    "log.message.timestamp.type": "message.timestamp.type",
    "compression.type": "compression.type",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "min.insync.replicas": "min.insync.replicas",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}

# Kafka's coarser spellings of two time defaults, in Kafka's precedence: the first form set
# wins (`log.retention.ms` over `.minutes` over `.hours`; `log.roll.ms` over `.hours`), each
# converted to the topic-level milliseconds. A negative retention in any form means forever.
_TIME_DEFAULT_FORMS = {
    "retention.ms": (("log.retention.ms", 1), ("log.retention.minutes", 60_000), ("log.retention.hours", 3_600_000)),
    "segment.ms": (("log.roll.ms", 1), ("log.roll.hours", 3_600_000)),
}
TIME_FORM_NAMES = {name for forms in _TIME_DEFAULT_FORMS.values() for name, _ in forms}

# The topic defaults a running broker takes without a restart (broker/dynamic_config.py):
# Kafka's dynamic log configs, every spelling of the two time defaults included (a dynamic
# form is merged with the static ones before Kafka's precedence picks one), and
# unclean.leader.election.enable (the controller takes it: broker/controller/shell.py).
DYNAMIC_TOPIC_DEFAULT_NAMES = {
    **_TOPIC_DEFAULT_NAMES,
    **{name: topic_name for topic_name, forms in _TIME_DEFAULT_FORMS.items() for name, _ in forms},
}


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    """Broker settings (Kafka's names, dots to underscores)."""

    num_partitions: int = 1
    # Kafka's default is true, but an exactly-once system should not invent topics from
    # typos: a producer writing to "ordres" gets UNKNOWN_TOPIC_OR_PARTITION, not a new topic.
    auto_create_topics_enable: bool = False
    # Kafka's default is 300000; 5 s here because the same tick drives flush.ms and
    # segment.ms, which users expect to act within seconds, and a tick is cheap.
    log_retention_check_interval_ms: int = 5000
    socket_request_max_bytes: int = GRPC_MESSAGE_BYTES_MAX
    producer_id_expiration_ms: int = 86400000
    transaction_state_log_num_partitions: int = 50
    # How often the coordinator aborts transactions open past their timeout (Kafka's name
    # and default); tests make it short to see a hanging transaction aborted.
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10000
    transaction_max_timeout_ms: int = 900000          # Kafka's transaction.max.timeout.ms
    transactional_id_expiration_ms: int = 604800000   # Kafka's transactional.id.expiration.ms (7 days)
    group_initial_rebalance_delay_ms: int = GROUP_INITIAL_REBALANCE_DELAY_MS
    group_min_session_timeout_ms: int = GROUP_MIN_SESSION_TIMEOUT_MS
    group_max_session_timeout_ms: int = GROUP_MAX_SESSION_TIMEOUT_MS
    group_max_size: int = GROUP_MAX_SIZE
    offset_metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES
    # Partitions of __consumer_offsets when the broker creates it; a topic that exists keeps
    # its count (the group coordinator uses and logs the count it finds, as Kafka does).
    offsets_topic_num_partitions: int = OFFSETS_TOPIC_PARTITIONS
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024   # Kafka's offsets.topic.segment.bytes
    topic_defaults: TopicConfig = TopicConfig()
    # The spellings of the time defaults given (name, value), e.g. (("log.retention.hours",
    # "24"),): a dynamic spelling is weighed against them by Kafka's precedence.
    time_defaults_given: tuple[tuple[str, str], ...] = ()
    # ---- log compaction (Kafka's LogCleaner settings and defaults) ----
    log_cleaner_enable: bool = True
    log_cleaner_threads: int = 1
    log_cleaner_dedupe_buffer_size: int = 134217728   # bytes for all threads' key maps
    log_cleaner_io_buffer_load_factor: float = 0.9    # how full a key map may get
    log_cleaner_backoff_ms: int = 15000               # sleep when no log needs cleaning
    # ---- the cluster (ZooKeeper mode); none of these matter on a cluster of one ----
    zookeeper_connect: str = ""                 # empty: a cluster of one, no ZooKeeper
    zookeeper_session_timeout_ms: int = 18000
    broker_rack: str = ""
    default_replication_factor: int = 1
    replica_lag_time_max_ms: int = 30000
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_per_broker_percentage: int = 10
    leader_imbalance_check_interval_seconds: int = 300
    controlled_shutdown_enable: bool = True
    controlled_shutdown_max_retries: int = 3
    controlled_shutdown_retry_backoff_ms: int = 5000
    # Kafka's log.dirs: more directories for partitions (JBOD) besides the data dir, which
    # keeps the broker's own files (meta.properties, the topic registry, producer ids) and
    # is always the first log dir.
    log_dirs: tuple[str, ...] = ()
    # ---- threads (see rpc_pool_limits) ----
    num_io_threads: int = RPC_WORKERS_FOR_SHORT_CALLS
    queued_max_requests: int = QUEUED_MAX_REQUESTS
    # ---- operations (broker/metrics.py) ----
    # eos's own key (Kafka exposes JMX; a JMX exporter's port plays this part): Prometheus
    # metrics over HTTP on this port of the broker's host; -1 (the default): none, and no
    # per-request metrics are kept; 0: a free port.
    metrics_port: int = -1
    # eos's own key: the broker's calls also served as frames over plain TCP on this port
    # of the PLAINTEXT listener's host (broker/socket_server.py), which PLAINTEXT clients
    # and followers then use (Kafka's clients speak such frames; Python gRPC's thread
    # hand-offs cost about 0.4 ms a round trip more). 0 (the default): a free port, on a
    # broker with a PLAINTEXT listener; N: that port; -1: none, everything over gRPC.
    socket_transport_port: int = 0
    # Kafka's: a socket-port connection on which nothing arrives this long is closed
    # (broker/socket_server.py), so idle connections cannot hold its places for good; -1: never.
    connections_max_idle_ms: int = 600_000
    # ---- listeners and TLS (broker/security.py) ----
    # Kafka's listeners; empty: one PLAINTEXT listener on the host and port BrokerServer is given.
    listeners: tuple[Listener, ...] = ()
    advertised_listeners: str = ""             # parsed against the listeners at start
    inter_broker_listener_name: str = ""       # empty: the first listener
    ssl_certificate_location: str = ""         # PEM certificate (chain) of the SSL listener
    ssl_key_location: str = ""                 # its unencrypted PEM private key
    ssl_ca_location: str = ""                  # PEM CA bundle that client certificates must chain to
    ssl_client_auth: str = "none"              # Kafka's none | required ("requested": see from_dict)
    ssl_principal_mapping_rules: tuple[PrincipalRule, ...] = parse_principal_mapping_rules("DEFAULT")
    # eos's safe default: a PLAINTEXT listener reachable from other machines is refused unless allowed.
    allow_plaintext_remote: bool = False
    # ---- authorization (broker/authorizer.py, broker/acl.py) ----
    authorizer_class_name: str = ""            # empty: no authorizer, every call allowed
    super_users: frozenset[str] = frozenset()  # Kafka's super.users, "User:a;User:b"
    allow_everyone_if_no_acl_found: bool = False
    # ---- client quotas (broker/quotas.py): Kafka's sampled rate window ----
    quota_window_num: int = QUOTA_WINDOW_NUM
    quota_window_size_seconds: int = QUOTA_WINDOW_SIZE_MS // 1000
    # ---- SASL/SCRAM (broker/security_service.py, broker/scram_users.py) ----
    sasl_enabled_mechanisms: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512")
    connections_max_reauth_ms: int = 0         # Kafka's: 0 = a session lasts (eos: one hour, then again)

    @classmethod
    def from_dict(cls, config: Mapping[str, str] | None) -> "BrokerConfig":
        values: dict = {}
        security: dict[str, str] = {}
        topic_overrides: dict[str, str] = {}
        time_forms: dict[str, str] = {}
        for name, raw in (config or {}).items():
            raw = str(raw).strip()
            if name in TIME_FORM_NAMES:
                time_forms[name] = raw
            elif name in _TOPIC_DEFAULT_NAMES:
                topic_overrides[_TOPIC_DEFAULT_NAMES[name]] = raw
            elif name in _INT_SETTINGS:
                attribute, minimum, maximum = _INT_SETTINGS[name]
                values[attribute] = _parse_int(name, raw, minimum=minimum, maximum=maximum)
            elif name in _BOOL_SETTINGS:
                values[_BOOL_SETTINGS[name]] = _parse_bool(name, raw)
            elif name in _TEXT_SETTINGS:
                values[_TEXT_SETTINGS[name]] = raw
            elif name in _SECURITY_NAMES:
                security[name] = raw
            elif name in _SPECIAL_SETTINGS:
                if name == "log.dir" and "log.dirs" in config:
                    continue          # Kafka's precedence: log.dirs, when both are given
                values.update(_SPECIAL_SETTINGS[name](name, raw))
            else:
                raise InvalidConfigError(f"unknown broker config {name!r}")
        if values.get("group_min_session_timeout_ms", GROUP_MIN_SESSION_TIMEOUT_MS) > values.get(
                "group_max_session_timeout_ms", GROUP_MAX_SESSION_TIMEOUT_MS):
            raise InvalidConfigError("group.min.session.timeout.ms must not exceed group.max.session.timeout.ms")
        if values.get("connections_max_idle_ms") == 0:
            raise InvalidConfigError("invalid value '0' for connections.max.idle.ms: -1 (never) or at least 1 ms "
                                     "(0 would close every connection before its first request)")
        values.update(_security_settings(security, clustered=bool(values.get("zookeeper_connect"))))
        if values.get("socket_transport_port", -1) > 0:
            _check_socket_transport(values)
        topic_overrides.update(time_defaults(time_forms))
        try:
            topic_defaults = TopicConfig.from_overrides(topic_overrides)
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"broker default topic config: {exc}") from None
        return cls(topic_defaults=topic_defaults, time_defaults_given=tuple(sorted(time_forms.items())), **values)


_SECURITY_NAMES = frozenset({
    "listeners", "advertised.listeners", "listener.security.protocol.map", "inter.broker.listener.name",
    "ssl.certificate.location", "ssl.key.location", "ssl.ca.location", "ssl.client.auth",
    "ssl.principal.mapping.rules", "allow.plaintext.remote", "sasl.enabled.mechanisms", "connections.max.reauth.ms",
})


def _security_settings(raw: Mapping[str, str], *, clustered: bool) -> dict:
    """The listener and TLS settings as BrokerConfig fields, checked together (no I/O: the
    PEM files are read when the broker starts)."""
    values: dict = {}
    if "allow.plaintext.remote" in raw:
        text = raw["allow.plaintext.remote"].lower()
        if text not in ("true", "false"):
            raise InvalidConfigError(f"invalid value {raw['allow.plaintext.remote']!r} for allow.plaintext.remote: "
                                     f"must be true or false")
        values["allow_plaintext_remote"] = text == "true"
    listeners: tuple[Listener, ...] = ()
    if "listeners" in raw:
        listeners = parse_listeners(raw["listeners"], parse_protocol_map(raw.get("listener.security.protocol.map")))
        values["listeners"] = listeners
    elif "listener.security.protocol.map" in raw:
        parse_protocol_map(raw["listener.security.protocol.map"])   # checked even if unused
    if "advertised.listeners" in raw:
        values["advertised_listeners"] = raw["advertised.listeners"]
    names = [listener.name for listener in listeners] or [PLAINTEXT]
    inter_broker = raw.get("inter.broker.listener.name", "").upper()
    if inter_broker:
        if inter_broker not in names:
            raise InvalidConfigError(f"inter.broker.listener.name {inter_broker} is not one of the listeners "
                                     f"({', '.join(names)})")
        values["inter_broker_listener_name"] = inter_broker
    client_auth = raw.get("ssl.client.auth", "none").lower()
    if client_auth not in CLIENT_AUTH_VALUES:
        raise InvalidConfigError(f"invalid value {raw['ssl.client.auth']!r} for ssl.client.auth: must be one of "
                                 f"{', '.join(CLIENT_AUTH_VALUES)}")
    if client_auth == "requested":
        # Kafka's "requested" asks for a certificate and accepts a client without one; gRPC's
        # Python API offers "do not ask" and "ask and require" only.
        raise InvalidConfigError("ssl.client.auth=requested is not available in eos (gRPC's Python server "
                                 "credentials either do not ask for a client certificate or require one): "
                                 "use required or none")
    values["ssl_client_auth"] = client_auth
    for name in ("ssl.certificate.location", "ssl.key.location", "ssl.ca.location"):
        if name in raw:
            values[name.replace(".", "_")] = raw[name]
    if "ssl.principal.mapping.rules" in raw:
        values["ssl_principal_mapping_rules"] = parse_principal_mapping_rules(raw["ssl.principal.mapping.rules"])
    if "sasl.enabled.mechanisms" in raw:
        mechanisms = tuple(m.strip().upper() for m in raw["sasl.enabled.mechanisms"].split(",") if m.strip())
        unknown = [m for m in mechanisms if m not in SCRAM_MECHANISMS]
        if unknown or not mechanisms:
            raise InvalidConfigError(f"sasl.enabled.mechanisms: eos offers {', '.join(sorted(SCRAM_MECHANISMS))}"
                                     + (f", not {', '.join(unknown)}" if unknown else ""))
        values["sasl_enabled_mechanisms"] = mechanisms
    if "connections.max.reauth.ms" in raw:
        try:
            values["connections_max_reauth_ms"] = int(raw["connections.max.reauth.ms"])
        except ValueError:
            values["connections_max_reauth_ms"] = -1
        if values["connections_max_reauth_ms"] < 0 or 0 < values["connections_max_reauth_ms"] < REAUTH_MS_MIN:
            raise InvalidConfigError(f"invalid value {raw['connections.max.reauth.ms']!r} for "
                                     f"connections.max.reauth.ms: 0 (sessions of one hour) or at least "
                                     f"{REAUTH_MS_MIN} ms (a shorter session would be renewed all the time)")
    if any(transport_of(listener.security_protocol) == SSL for listener in listeners):
        missing = [name for name in ("ssl.certificate.location", "ssl.key.location") if not raw.get(name)]
        if missing:
            raise InvalidConfigError(f"an SSL or SASL_SSL listener needs {' and '.join(missing)} (PEM files)")
        if client_auth == "required" and not raw.get("ssl.ca.location"):
            raise InvalidConfigError("ssl.client.auth=required needs ssl.ca.location: the CA bundle that client "
                                     "certificates are checked against")
    if clustered:
        inter = next((l for l in listeners if l.name == (inter_broker or names[0])), None)
        if inter is not None and inter.security_protocol not in (PLAINTEXT, SSL):
            # A broker would need SCRAM credentials of its own (Kafka's per-listener JAAS
            # configuration); mutual TLS gives the broker a principal without one.
            raise InvalidConfigError(f"inter.broker.listener.name {inter.name} is {inter.security_protocol}: "
                                     f"eos's brokers talk to each other over a PLAINTEXT or an SSL (mutual TLS) "
                                     f"listener; name one with inter.broker.listener.name")
        if inter is not None and inter.security_protocol == SSL and not raw.get("ssl.ca.location"):
            raise InvalidConfigError("an SSL inter-broker listener needs ssl.ca.location: the CA the other "
                                     "brokers' certificates are checked against")
    return values


def _check_socket_transport(values: dict) -> None:
    """A port named for socket.transport.port serves plain TCP: a PLAINTEXT listener's calls
    (the default, 0, serves only where there is such a listener)."""
    listeners = values.get("listeners") or ()
    if listeners and not any(listener.security_protocol == PLAINTEXT for listener in listeners):
        raise InvalidConfigError("socket.transport.port carries a PLAINTEXT listener's calls over plain TCP, "
                                 "and no listener is PLAINTEXT")


# Settings that are one integer, one boolean or one string: name -> BrokerConfig field
# (and the integer's bounds, maximum None: unbounded).
_INT_SETTINGS = {
    "num.partitions": ("num_partitions", 1, None),
    "log.retention.check.interval.ms": ("log_retention_check_interval_ms", 1, None),
    "socket.request.max.bytes": ("socket_request_max_bytes", 1, GRPC_MESSAGE_BYTES_MAX * 20),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", 1, None),
    "offsets.topic.segment.bytes": ("offsets_topic_segment_bytes", 1024, None),
    "offsets.topic.num.partitions": ("offsets_topic_num_partitions", 1, None),
    "transaction.state.log.num.partitions": ("transaction_state_log_num_partitions", 1, None),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (
        "transaction_abort_timed_out_transaction_cleanup_interval_ms", 1, None),
    "transaction.max.timeout.ms": ("transaction_max_timeout_ms", 1, None),
    "transactional.id.expiration.ms": ("transactional_id_expiration_ms", 1, None),
    "num.io.threads": ("num_io_threads", 1, 1024),
    "metrics.port": ("metrics_port", -1, 65535),
    "socket.transport.port": ("socket_transport_port", -1, 65535),
    # -1: never (Kafka's); at most 2^31-1 ms (about 25 days), as Kafka's int
    "connections.max.idle.ms": ("connections_max_idle_ms", -1, 2**31 - 1),
    "quota.window.num": ("quota_window_num", 2, 1000),
    "quota.window.size.seconds": ("quota_window_size_seconds", 1, 3600),
    "queued.max.requests": ("queued_max_requests", 1, None),
    "zookeeper.session.timeout.ms": ("zookeeper_session_timeout_ms", 1000, None),
    "default.replication.factor": ("default_replication_factor", 1, None),
    "replica.lag.time.max.ms": ("replica_lag_time_max_ms", 1, None),
    "leader.imbalance.per.broker.percentage": ("leader_imbalance_per_broker_percentage", 0, None),
    "leader.imbalance.check.interval.seconds": ("leader_imbalance_check_interval_seconds", 1, None),
    "controlled.shutdown.max.retries": ("controlled_shutdown_max_retries", 0, None),
    "controlled.shutdown.retry.backoff.ms": ("controlled_shutdown_retry_backoff_ms", 0, None),
    "log.cleaner.threads": ("log_cleaner_threads", 0, None),
    "log.cleaner.dedupe.buffer.size": ("log_cleaner_dedupe_buffer_size", 1024, None),
    "log.cleaner.backoff.ms": ("log_cleaner_backoff_ms", 1, None),
    "group.initial.rebalance.delay.ms": ("group_initial_rebalance_delay_ms", 0, None),
    "group.min.session.timeout.ms": ("group_min_session_timeout_ms", 1, None),
    "group.max.session.timeout.ms": ("group_max_session_timeout_ms", 1, None),
    "group.max.size": ("group_max_size", 1, None),
    "offset.metadata.max.bytes": ("offset_metadata_max_bytes", 1, None),
}
_BOOL_SETTINGS = {
    "auto.create.topics.enable": "auto_create_topics_enable",
    "allow.everyone.if.no.acl.found": "allow_everyone_if_no_acl_found",
    "log.cleaner.enable": "log_cleaner_enable",
    "auto.leader.rebalance.enable": "auto_leader_rebalance_enable",
    "controlled.shutdown.enable": "controlled_shutdown_enable",
}
_TEXT_SETTINGS = {"zookeeper.connect": "zookeeper_connect", "broker.rack": "broker_rack"}


def _load_factor(name: str, raw: str) -> dict:
    try:
        factor = float(raw)
    except ValueError:
        raise InvalidConfigError(f"invalid value {raw!r} for {name}") from None
    if not 0.0 < factor <= 1.0:
        raise InvalidConfigError(f"invalid value {raw!r} for {name}: must be in (0, 1]")
    return {"log_cleaner_io_buffer_load_factor": factor}


def _log_dirs(name: str, raw: str) -> dict:
    log_dirs = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not log_dirs:
        raise InvalidConfigError(f"invalid value {raw!r} for {name}: no directory")
    return {"log_dirs": log_dirs}


def _no_network_threads(name: str, raw: str) -> dict:
    raise InvalidConfigError(
        "num.network.threads is not a setting of eos: gRPC's C core does the network I/O "
        "(its completion-queue threads have no size setting); num.io.threads sizes the "
        "request handlers and queued.max.requests the requests that may wait for one")


def _authorizer_class(name: str, raw: str) -> dict:
    if raw and raw not in AUTHORIZER_CLASS_NAMES:
        raise InvalidConfigError(
            f"authorizer.class.name {raw!r} is not an authorizer eos has: use "
            f"org.apache.kafka.metadata.authorizer.StandardAuthorizer, "
            f"kafka.security.authorizer.AclAuthorizer or eos.AclAuthorizer (all the same ACL "
            f"authorizer), or leave it empty for none")
    return {"authorizer_class_name": raw}


def _super_users(name: str, raw: str) -> dict:
    try:
        return {"super_users": parse_super_users(raw)}
    except InvalidAclError as exc:
        raise InvalidConfigError(f"invalid super.users {raw!r}: {exc}") from None


# Settings parsed by a function of their own: name -> (name, raw) -> BrokerConfig fields.
_SPECIAL_SETTINGS = {
    "log.cleaner.io.buffer.load.factor": _load_factor,
    "log.dirs": _log_dirs,
    "log.dir": _log_dirs,
    "num.network.threads": _no_network_threads,
    "authorizer.class.name": _authorizer_class,
    "super.users": _super_users,
}


def describe_settings(config: BrokerConfig, given: Mapping[str, str],
                      log_dirs: Iterable[str] = ()) -> dict[str, tuple[str | None, bool]]:
    """Every broker setting eos has, as Kafka's DescribeConfigs of a broker lists them: name
    -> (value as text, None when unset and without a default; whether `given` -- the
    settings the broker was started with -- set it). The topic-config defaults are listed
    under their broker names; a time default's milliseconds form (`log.retention.ms`) holds
    the value in force, set by whichever of its forms won, and its coarser forms are listed
    as given. `log_dirs`: the directories the broker uses (its data dir first). eos's
    broker settings are all static (read-only)."""
    def text(value) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, (tuple, frozenset)):
            return ",".join(sorted(value) if isinstance(value, frozenset) else value)
        return str(value)

    topic_defaults = config.topic_defaults.to_kafka_names()
    described: dict[str, tuple[str | None, bool]] = {}
    for name, (attribute, _, _) in _INT_SETTINGS.items():
        described[name] = (text(getattr(config, attribute)), name in given)
    for name, attribute in {**_BOOL_SETTINGS, **_TEXT_SETTINGS}.items():
        described[name] = (text(getattr(config, attribute)), name in given)
    for name, topic_name in _TOPIC_DEFAULT_NAMES.items():
        described[name] = (topic_defaults[topic_name], name in given)
    for topic_name, forms in _TIME_DEFAULT_FORMS.items():
        described[forms[0][0]] = (topic_defaults[topic_name], any(form in given for form, _ in forms))
        for form, _ in forms[1:]:
            described[form] = (given.get(form, "").strip() or None, form in given)
    described["log.dirs"] = (",".join(log_dirs or config.log_dirs) or None, "log.dirs" in given or "log.dir" in given)
    described["log.dir"] = (given.get("log.dir", "").strip() or None, "log.dir" in given)
    described["log.cleaner.io.buffer.load.factor"] = (text(config.log_cleaner_io_buffer_load_factor),
                                                      "log.cleaner.io.buffer.load.factor" in given)
    described["authorizer.class.name"] = (config.authorizer_class_name or None, "authorizer.class.name" in given)
    described["super.users"] = (";".join(sorted(config.super_users)) or None, "super.users" in given)
    # the parsed value where it has a text form; the listeners, their protocol map and the
    # principal rules as given (their parsed forms are not Kafka's text)
    parsed = {"ssl.client.auth": config.ssl_client_auth, "allow.plaintext.remote": text(config.allow_plaintext_remote),
              "sasl.enabled.mechanisms": text(config.sasl_enabled_mechanisms),
              "connections.max.reauth.ms": text(config.connections_max_reauth_ms),
              "inter.broker.listener.name": config.inter_broker_listener_name or None,
              "ssl.certificate.location": config.ssl_certificate_location or None,
              "ssl.key.location": config.ssl_key_location or None,
              "ssl.ca.location": config.ssl_ca_location or None}
    as_given = {"ssl.principal.mapping.rules": "DEFAULT"}
    for name in _SECURITY_NAMES:
        value = parsed[name] if name in parsed else given.get(name, as_given.get(name, "")).strip() or None
        described[name] = (value, name in given)
    return dict(sorted(described.items()))


def _parse_bool(name: str, raw: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise InvalidConfigError(f"invalid value {raw!r} for {name}: must be true or false")
    return raw.lower() == "true"


def time_defaults(time_forms: Mapping[str, str]) -> dict[str, str]:
    """The topic-level `retention.ms` / `segment.ms` defaults the broker's time settings give,
    by Kafka's precedence; every form given is validated, the ones outranked included."""
    resolved: dict[str, str] = {}
    for topic_name, forms in _TIME_DEFAULT_FORMS.items():
        chosen_ms = None
        for name, unit_ms in forms:
            if name not in time_forms:
                continue
            minimum = -1 if topic_name == "retention.ms" else 1
            value = _parse_int(name, time_forms[name], minimum=minimum)
            if chosen_ms is None:
                chosen_ms = -1 if value < 0 else value * unit_ms
        if chosen_ms is not None:
            resolved[topic_name] = str(chosen_ms)
    return resolved


def time_forms_in_force(time_forms: Mapping[str, str]) -> dict[str, str]:
    """Topic-level name -> the broker spelling among `time_forms` whose value it takes
    (Kafka's precedence: `.ms` over `.minutes` over `.hours`)."""
    return {topic_name: next(name for name, _ in forms if name in time_forms)
            for topic_name, forms in _TIME_DEFAULT_FORMS.items()
            if any(name in time_forms for name, _ in forms)}


def _parse_int(name: str, raw: str, *, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise InvalidConfigError(f"invalid value {raw!r} for {name}: not an integer") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise InvalidConfigError(f"invalid value {raw!r} for {name}: must be {bound}")
    return value
