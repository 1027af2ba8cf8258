"""Dynamic broker configs: the topic defaults an operator changes on running brokers.

Theory of operation
-------------------
Kafka lets `kafka-configs --entity-type brokers --entity-default | --entity-name <id>
--alter` change some broker settings without a restart (its DynamicBrokerConfig). eos does
this for the settings that are a topic config's default (`DYNAMIC_TOPIC_DEFAULT_NAMES`:
log.retention.ms, log.segment.bytes, message.max.bytes, unclean.leader.election.enable, ...),
which every topic without an override of its own follows. Every other broker setting stays
static: altering one is refused with INVALID_REQUEST naming it ("Cannot update these configs
dynamically", Kafka's words), and nothing changes.

The time defaults have several spellings (log.retention.ms / .minutes / .hours, log.roll.ms /
.hours). As in Kafka, the values are merged name by name -- the static ones, the cluster-wide
dynamic ones over them, the broker's own over those -- and only then does the precedence of
the spellings pick one: a dynamic log.retention.hours does not outrank a static
log.retention.ms, a dynamic log.retention.ms outranks both.

Two entities, Kafka's: the cluster-wide default (resource name "", stored as `<default>`)
and one broker (its id). Precedence, Kafka's: the broker's own dynamic value, then the
cluster-wide one, then the static setting it started with, then Kafka's default
(`effective_defaults`).

Where they live: on a ZooKeeper cluster in Kafka's znodes /config/brokers/<default> and
/config/brokers/<id>, written and followed through `ZkEntityConfigs` (a change notification
makes every broker read them again); on a single broker in
`<data-dir>/dynamic-broker-configs.json`, written atomically before the change is applied.

`DynamicBrokerConfigs` is the one owner of the dynamic values on a broker. After every
change (its own, or another broker's seen through ZooKeeper) it hands the effective topic
defaults to `apply`, which the broker wires to `TopicDefaultsFollower`: the topic registry
computes every topic's config again, and the open logs whose config changed take it: a new retention, segment size
or message limit acts at once, as after a topic's own alteration. On a cluster `apply` also
hands unclean.leader.election.enable to this broker's controller candidate, which, when it is
the active controller and the default turned on, elects leaders for the partitions without
one of the topics that follow it (Kafka's enableDefaultUncleanLeaderElection). Alterations are checked
whole before anything is written: an unknown or static name, an operation other than SET
and DELETE, a value the topic config refuses.
"""
from __future__ import annotations

import functools
import logging
import threading
from typing import Callable, Iterable, Mapping

from broker.config import DYNAMIC_TOPIC_DEFAULT_NAMES, TIME_FORM_NAMES, time_defaults, time_forms_in_force
from eos.config import TopicConfig
from eos.config_resources import (OP_DELETE, OP_NAMES, OP_SET, SOURCE_DYNAMIC_BROKER_CONFIG,
                                  SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG)
from eos.errors import InvalidConfigError, InvalidRequestError
from eos.files import read_json_document, write_json_document

log = logging.getLogger("eos.broker.dynamic_config")

DEFAULT_ENTITY = "<default>"          # Kafka's znode name of the cluster-wide default
FILE_NAME = "dynamic-broker-configs.json"
FILE_VERSION = 1
ZK_ENTITY_PREFIX = "brokers/"         # ZkEntityConfigs' entity paths: brokers/<default>, brokers/0


# ---- the rules (pure) ---------------------------------------------------------------------------

def entity_name(resource_name: str) -> str:
    """A DescribeConfigs / IncrementalAlterConfigs broker resource name as stored: "" (the
    cluster-wide default) is `<default>`, a broker id stays its id."""
    return DEFAULT_ENTITY if resource_name == "" else resource_name


def effective_defaults(static: TopicConfig, cluster_default: Mapping[str, str],
                       own: Mapping[str, str], static_time_forms: Mapping[str, str] | None = None) -> TopicConfig:
    """The topic defaults in force: `static` (what the broker started with, its time
    defaults given as `static_time_forms`) under the cluster-wide dynamic values, under the
    broker's own; the time defaults' spellings merged name by name first (module doc)."""
    merged = _ours({**cluster_default, **own})
    if not merged:
        return static
    overrides = {DYNAMIC_TOPIC_DEFAULT_NAMES[name]: value for name, value in merged.items()
                 if name not in TIME_FORM_NAMES}
    dynamic_forms = {name: value for name, value in merged.items() if name in TIME_FORM_NAMES}
    if dynamic_forms:
        overrides.update(time_defaults({**(static_time_forms or {}), **dynamic_forms}))
    return TopicConfig.from_overrides(overrides, base=static)


def topic_sources(cluster_default: Mapping[str, str], own: Mapping[str, str],
                  static_time_forms: Mapping[str, str] | None = None) -> dict[str, int]:
    """Topic-level config name -> the DescribeConfigs source of the dynamic value its default
    takes: only where a dynamic value is the one in force (a dynamic log.retention.hours under
    a static log.retention.ms is not)."""
    in_force = sources(cluster_default, own)
    found = {DYNAMIC_TOPIC_DEFAULT_NAMES[name]: source for name, (_, source) in in_force.items()
             if name not in TIME_FORM_NAMES}
    merged_forms = {**(static_time_forms or {}), **{name: value for name, (value, _) in in_force.items()
                                                    if name in TIME_FORM_NAMES}}
    for topic_name, name in time_forms_in_force(merged_forms).items():
        if name in in_force:
            found[topic_name] = in_force[name][1]
    return found


def _ours(values: Mapping[str, str]) -> dict[str, str]:
    """The values eos applies: Kafka's tools keep other dynamic broker configs in the same
    znodes (kafka-reassign-partitions' leader.replication.throttled.rate); eos leaves them
    there and ignores them, as a broker of another version would."""
    return {name: value for name, value in values.items() if name in DYNAMIC_TOPIC_DEFAULT_NAMES}


def altered(current: Mapping[str, str], alterations: Iterable, static: TopicConfig,
            static_time_forms: Mapping[str, str] | None = None) -> dict[str, str]:
    """One entity's dynamic values after `alterations` (AlterableConfig: name,
    config_operation, value), checked whole: a name given twice, a name that is not a
    dynamic one, an operation other than SET and DELETE (INVALID_REQUEST); a value the
    topic default would refuse (INVALID_CONFIG). Nothing is changed by a refusal."""
    result = dict(current)
    seen: set[str] = set()
    static_names = []
    for alteration in alterations:
        name = alteration.name
        if name in seen:
            raise InvalidRequestError(f"config {name!r} appears more than once")
        seen.add(name)
        if name not in DYNAMIC_TOPIC_DEFAULT_NAMES:
            static_names.append(name)
            continue
        if alteration.config_operation == OP_SET:
            result[name] = alteration.value
        elif alteration.config_operation == OP_DELETE:
            result.pop(name, None)
        else:
            raise InvalidRequestError(f"{OP_NAMES.get(alteration.config_operation, alteration.config_operation)} "
                                      f"of broker config {name!r}: only SET and DELETE apply to a broker's configs")
    if static_names:
        raise InvalidRequestError(f"Cannot update these configs dynamically: {sorted(static_names)} (eos's dynamic "
                                  f"broker configs are the topic defaults: {sorted(DYNAMIC_TOPIC_DEFAULT_NAMES)})")
    for name, value in result.items():
        try:
            effective_defaults(static, {}, {name: value}, static_time_forms)
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"{name}={value!r}: {exc}") from None
    return result


def sources(cluster_default: Mapping[str, str], own: Mapping[str, str]) -> dict[str, tuple[str, int]]:
    """Broker config name -> (value, DescribeConfigs source) of every dynamic value in force."""
    found = {name: (value, SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG) for name, value in _ours(cluster_default).items()}
    found.update((name, (value, SOURCE_DYNAMIC_BROKER_CONFIG)) for name, value in _ours(own).items())
    return found


# ---- the owner (I/O) ----------------------------------------------------------------------------

class DynamicBrokerConfigs:
    """See the module doc. Exactly one of `data_dir` (a single broker) or `zk_configs` (a
    `ZkEntityConfigs`, on a cluster) says where the values live. `apply(defaults)` is called
    with the effective topic defaults after every change and once at `start()`."""

    def __init__(self, node_id: int, static: TopicConfig, apply: Callable[[TopicConfig], None], *,
                 static_time_forms: Mapping[str, str] | None = None, data_dir=None, zk_configs=None):
        if (data_dir is None) == (zk_configs is None):
            raise ValueError("give data_dir (a single broker) or zk_configs (a cluster)")
        self._own_entity = str(node_id)
        self._static = static
        self._static_time_forms = dict(static_time_forms or {})   # the time defaults' spellings given
        self._apply = apply
        self._path = None if data_dir is None else data_dir / FILE_NAME
        self._zk = zk_configs
        self._lock = threading.Lock()       # alterations of a single broker, one at a time
        self._entities: dict[str, dict[str, str]] = {}

    def start(self) -> None:
        if self._zk is not None:
            self._zk.add_listener(self._follow)     # called now, then after every reload
            return
        if self._path.exists():
            try:
                document = read_json_document(self._path, FILE_VERSION)
                self._entities = {str(k): dict(v) for k, v in document["entities"].items()}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise InvalidConfigError(f"{self._path} is damaged ({exc}): fix or remove it") from None
        self._publish()

    # ---- reading --------------------------------------------------------------------------

    def values(self, resource_name: str) -> dict[str, str]:
        """The dynamic values of one entity ("" the cluster-wide default, else a broker id)."""
        return dict(self._entities.get(entity_name(resource_name), {}))

    def in_force(self) -> dict[str, tuple[str, int]]:
        """This broker's dynamic values in force: name -> (value, source)."""
        return sources(self._entities.get(DEFAULT_ENTITY, {}), self._entities.get(self._own_entity, {}))

    @property
    def defaults(self) -> TopicConfig:
        return effective_defaults(self._static, self._entities.get(DEFAULT_ENTITY, {}),
                                  self._entities.get(self._own_entity, {}), self._static_time_forms)

    def topic_sources(self) -> dict[str, int]:
        """Topic-level name -> source, where a topic default's value in force is a dynamic one."""
        return topic_sources(self._entities.get(DEFAULT_ENTITY, {}), self._entities.get(self._own_entity, {}),
                             self._static_time_forms)

    # ---- altering -------------------------------------------------------------------------

    def alter(self, resource_name: str, alterations, validate_only: bool) -> None:
        """Apply one resource's alterations (see `altered`) and the result everywhere."""
        entity = entity_name(resource_name)
        if entity != DEFAULT_ENTITY and entity != self._own_entity:
            raise InvalidRequestError(f"this is broker {self._own_entity}, asked to alter the configs of broker "
                                      f"{resource_name!r}: ask that broker")
        alterations = list(alterations)
        with self._lock:
            wanted = altered(self._entities.get(entity, {}), alterations, self._static, self._static_time_forms)
            if validate_only:
                return
            if self._zk is not None:
                # The operations as asked, not a difference from this broker's copy, which may
                # lag a change made through another broker; ZkEntityConfigs applies them to
                # the znode under its version. Its reload calls _follow, which applies them.
                self._zk.alter({ZK_ENTITY_PREFIX + entity: {
                    a.name: a.value if a.config_operation == OP_SET else None for a in alterations}})
                return
            entities = {**self._entities, entity: wanted}
            write_json_document(self._path, FILE_VERSION,
                                {"entities": {name: values for name, values in entities.items() if values}})
            self._entities = entities
            self._publish()
        log.info("dynamic broker configs of %s now %s", entity, wanted)

    # ---- applying -------------------------------------------------------------------------

    def _follow(self, snapshot: Mapping[str, Mapping[str, str]]) -> None:
        """ZkEntityConfigs' listener: the brokers' entities of a reloaded snapshot."""
        entities = {path[len(ZK_ENTITY_PREFIX):]: dict(values) for path, values in snapshot.items()
                    if path.startswith(ZK_ENTITY_PREFIX)}
        if entities == self._entities:
            return
        self._entities = entities
        self._publish()

    def _publish(self) -> None:
        try:
            defaults = self.defaults
        except InvalidConfigError as exc:
            # Written by another tool or another version: the broker keeps its defaults.
            log.error("dynamic broker configs not applied: %s", exc)
            return
        self._apply(defaults)


class TopicDefaultsFollower:
    """`DynamicBrokerConfigs`' `apply` on a broker: the registry takes the new defaults
    (every topic's config computed again), then the open logs of the topics that changed --
    once the logs are loaded; `logs_loaded` catches up with a change that came while they
    loaded. One lock orders the changes, so a log never keeps an older one."""

    def __init__(self, registry):
        self._registry = registry
        self._lock = threading.Lock()
        self._log_manager = None         # set once the logs are loaded

    def apply(self, defaults: TopicConfig) -> None:
        with self._lock:
            changed = self._registry.set_default_config(defaults)
            if self._log_manager is not None:
                self._push(info.name for info in changed)
        if changed:
            log.info("topic defaults changed: %d topic(s) follow them", len(changed))

    def logs_loaded(self, log_manager, loaded: Mapping[str, TopicConfig]) -> None:
        """The logs are open, with `loaded` (topic -> config): from now on they follow."""
        with self._lock:
            self._log_manager = log_manager
            self._push(info.name for info in self._registry.topics()
                       if info.name in loaded and info.config != loaded[info.name])

    def _push(self, names) -> None:
        for name in names:     # the registry's config at the push, not a copy from before it
            self._registry.push_config(name, functools.partial(self._log_manager.update_config, name))
