"""Client quotas on a broker: where they are kept, and holding a client to its quota.

Theory of operation
-------------------
`ClientQuotas` owns where the quotas are kept -- a cluster of one's
`<data_dir>/client-quotas.json` (written atomically), or on a ZooKeeper cluster Kafka's
/config/users and /config/clients znodes (`broker.zk_entity_configs`, followed by every
broker, so a quota set through one broker holds on all; each broker measures the traffic it
serves, as Kafka's do) -- and the pure `broker/quotas.ClientQuotaManager` that measures the
rates. Calls come from
many gRPC threads, so every call into the manager holds one lock, never across a wait.

A Produce (unary or on a stream) or a client's Fetch goes through `hold(key)` before it is
handled and `charge(key, amount)` after: `hold` waits out a throttle the entity earned
before (Kafka mutes the connection for that long; here a gRPC worker waits, so at most one
call per sensor and HOLDS_MAX in all are held, and others are refused at once with the
throttle time), `charge` counts the request's bytes (a Produce's record bytes, a Fetch's
response record bytes) and gives the `throttle_time_ms` for the response. A fetch is cut to
what one quota window allows (`fetch_bytes_max`). The user is the call's principal name (`User:alice` -> `alice`), the
client id the `client-id` metadata the clients send. Replica fetches and in-process calls
(the broker's own coordinators, whose context carries no metadata) are not counted, as
Kafka's replication is not. Without any quota both are a check of an empty dict.

Request time (`request_percentage`, KIP-124): `RequestTimeQuotaInterceptor` wraps every call
while some entity has that quota (otherwise it hands the handler back untouched: one dict
lookup per call). It holds a call whose entity owes a request-time throttle (the same
bounded holds; a call that would need another hold is refused with RESOURCE_EXHAUSTED and a
`[throttled]` mark, which the clients retry after their backoff), runs it, and charges the
thread CPU time the handler used (on a stream, what each response took), in percent-seconds:
a long poll waiting in purgatory costs nothing, as Kafka counts only time on its request
threads; a stream is held before each of its messages. A response with `throttle_time_ms`
carries the larger of its throttles. Exempt, as in Kafka: the brokers' own requests (the
Cluster service, WriteTxnMarkers, a follower's Fetch -- `is_replica`, which needs
CLUSTER_ACTION under an authorizer -- and any call of a super user) and SASL authentication.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import grpc

from broker.quotas import (CLIENT_ID, CONSUMER_BYTE_RATE, DEFAULT, QUOTA_KEYS, QUOTA_WINDOW_NUM, QUOTA_WINDOW_SIZE_MS,
                           REQUEST_PERCENTAGE, USER, ClientQuotaManager, QuotaEntity, QuotaError, check_entity,
                           check_quota)
from broker.zk_entity_configs import entity_path
from broker.security import client_id_of_call, principal_of_call
from eos.net import THROTTLED_MARK
from eos.errors import InvalidConfigError
from eos.files import read_json_document, write_json_document

QUOTA_FILE_NAME = "client-quotas.json"
QUOTA_FILE_VERSION = 1
HOLD_MAX_MS = 30_000                        # the longest one call is held (the rest of a throttle is the client's)
HOLDS_MAX = 8                               # calls held at once, over all clients (each holds a gRPC worker)


class ClientQuotas:
    """See the module doc. Thread-safe."""

    def __init__(self, data_dir: Path | str, *, window_num: int = QUOTA_WINDOW_NUM,
                 window_size_ms: int = QUOTA_WINDOW_SIZE_MS, now_ms_fn: Callable[[], int] | None = None):
        self._path = Path(data_dir) / QUOTA_FILE_NAME
        self._zk = None                 # broker.zk_entity_configs.ZkEntityConfigs on a cluster
        self._now_ms = now_ms_fn or (lambda: time.monotonic_ns() // 1_000_000)
        self._lock = threading.Lock()
        self._manager = ClientQuotaManager(window_num=window_num, window_size_ms=window_size_ms)
        self._holding: set[tuple] = set()           # the sensors with a call held now
        self._closing = threading.Event()

    # ---- the quotas ---------------------------------------------------------------------------

    def follow_zookeeper(self, configs) -> int:
        """Keep the quotas in ZooKeeper from now on (a cluster); the number of entities with
        quotas there now."""
        self._zk = configs
        configs.add_listener(self._take_from_zookeeper)
        return len(self._manager.quotas)

    def _take_from_zookeeper(self, snapshot) -> None:
        from broker.zk_entity_configs import entity_of
        quotas = {}
        for path, config in snapshot.items():
            values = {}
            for key in QUOTA_KEYS:
                if key in config:
                    try:
                        values[key] = check_quota(key, float(config[key]))
                    except (ValueError, QuotaError):
                        continue    # another tool's bad value: not a quota (Kafka's brokers skip it too)
            if values:
                quotas[check_entity(QuotaEntity(*entity_of(path)))] = values
        with self._lock:
            self._manager.replace_quotas(quotas)

    def load(self) -> int:
        """Read the file (if any); the number of entities with quotas. A bad file stops the
        broker: running without the quotas an operator set would be silent."""
        if not self._path.exists():
            return 0
        try:
            document = read_json_document(self._path, QUOTA_FILE_VERSION)
            quotas = {_entity_from_json(item["entity"]): dict(item["quotas"]) for item in document["entries"]}
            with self._lock:
                self._manager.replace_quotas(quotas)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidConfigError(f"{self._path}: unreadable client quotas ({exc}); fix or remove the file") \
                from None
        return len(quotas)

    def describe(self) -> dict[QuotaEntity, dict[str, float]]:
        with self._lock:
            return self._manager.quotas

    def alter(self, alterations: Iterable[tuple[QuotaEntity, dict[str, float | None]]], *,
              validate_only: bool = False) -> None:
        """Set (a value) or remove (None) quota keys of entities, all or none; QuotaError
        names what is wrong before anything changes."""
        alterations = list(alterations)
        with self._lock:
            quotas = self._manager.quotas
            for entity, changes in alterations:
                values = quotas.setdefault(check_entity(entity), {})
                for key, value in changes.items():
                    if value is None:
                        check_quota(key, 1.0)          # a known key, even to remove it
                        values.pop(key, None)
                    else:
                        values[key] = check_quota(key, value)
            quotas = {entity: values for entity, values in quotas.items() if values}
            ClientQuotaManager(quotas)                 # the whole set checked again
            if validate_only:
                return
            if self._zk is None:
                write_json_document(self._path, QUOTA_FILE_VERSION, {"entries": [
                    {"entity": _entity_to_json(entity), "quotas": values}
                    for entity, values in sorted(quotas.items(), key=lambda item: item[0].describe())]})
                self._manager.replace_quotas(quotas)
                return
        # ZooKeeper: only the keys asked for change (a user's znode also holds its SCRAM
        # credentials). Not under the lock: the store's reload hands the new quotas back
        # through _take_from_zookeeper, which takes it.
        changes: dict[str, dict[str, str | None]] = {}
        for entity, values in alterations:
            entity = check_entity(entity)
            changes.setdefault(entity_path(entity.user, entity.client_id), {}).update(
                {key: None if value is None else _text(value) for key, value in values.items()})
        self._zk.alter(changes)

    # ---- holding clients to them ---------------------------------------------------------------

    def _who(self, context) -> tuple[str, str] | None:
        principal = principal_of_call(context)
        if principal is None:
            return None          # in process: the broker's own coordinators, never throttled
        user = principal.split(":", 1)[1] if ":" in principal else principal
        return user, client_id_of_call(context)

    def hold(self, key: str, context) -> tuple[tuple[str, str] | None, bool]:
        """Wait out the entity's throttle. Returns (who the call is, None: not counted; and
        whether the call may go on). A hold occupies a gRPC worker, so there is at most one
        per sensor and HOLDS_MAX in all, and the broker's shutdown ends them: a call that
        would need another is not held but refused at once (THROTTLING_QUOTA_EXCEEDED, or
        an empty fetch), with the throttle time -- a client that waits as told never is."""
        if not self._manager.any_quota():
            return None, True
        who = self._who(context)
        if who is None:
            return None, True
        with self._lock:
            delay_ms = self._manager.delay_ms(key, *who, self._now_ms())
            if delay_ms <= 0:
                return who, True
            sensor = self._manager.sensor(key, *who)
            if sensor in self._holding or len(self._holding) >= HOLDS_MAX:
                return who, False
            self._holding.add(sensor)
        try:
            self._closing.wait(min(delay_ms, HOLD_MAX_MS) / 1000.0)
        finally:
            with self._lock:
                self._holding.discard(sensor)
        return who, True

    def owed_ms(self, key: str, who: tuple[str, str] | None) -> int:
        """The throttle `who` still owes (for a refused call's answer)."""
        if who is None:
            return 0
        with self._lock:
            return self._manager.delay_ms(key, *who, self._now_ms())

    def would_hold(self, key: str, context) -> bool:
        """Whether a call now would be held (a produce stream answers what it has first)."""
        if not self._manager.any_quota():
            return False
        who = self._who(context)
        return who is not None and self.owed_ms(key, who) > 0

    def any_quota(self, key: str) -> bool:
        """Whether some entity has a `key` quota (no lock: the manager swaps its key set whole)."""
        return self._manager.any_quota(key)

    def charge(self, key: str, who: tuple[str, str] | None, amount: float, *,
               refund_if_throttled: bool = False) -> int:
        """Count `amount` bytes for `who` (from `hold`); the throttle time for the response.
        `refund_if_throttled`: a fetch over its quota is answered without its data, so its
        bytes are taken back at once, at the same instant (Kafka's unrecordQuotaSensor)."""
        if who is None:
            return 0
        with self._lock:
            now_ms = self._now_ms()
            throttle_ms = self._manager.record(key, *who, amount, now_ms)
            if throttle_ms > 0 and refund_if_throttled:
                self._manager.unrecord(key, *who, amount, now_ms)
            return throttle_ms

    def fetch_bytes_max(self, who: tuple[str, str] | None) -> int | None:
        """The most a fetch of `who` may carry: what one quota window allows (None: no quota)."""
        if who is None:
            return None
        with self._lock:
            return self._manager.window_bytes_max(CONSUMER_BYTE_RATE, *who)

    def close(self) -> None:
        """Shutdown: every held call goes on now."""
        self._closing.set()


# Calls never charged to a request quota (the brokers' own, and logging in).
_EXEMPT_PREFIXES = ("/eos.v1.Cluster/", "/eos.v1.Security/SaslAuthenticate", "/grpc.health.v1.Health/",
                    "/grpc.reflection.")
_EXEMPT_METHODS = frozenset({"/eos.v1.Broker/WriteTxnMarkers"})
PERCENT_SECONDS_PER_NS = 100 / 1e9        # one second of one thread is 100 (percent-seconds)


class RequestTimeQuotaInterceptor(grpc.ServerInterceptor):
    """Kafka's request quota over every call (see the module doc). Installed after the
    identity interceptor, so the call's principal is known when it runs."""

    def __init__(self, quotas: ClientQuotas, *, super_users: frozenset[str] = frozenset()):
        self._quotas = quotas
        # The brokers' own principals (super users) are never charged: their Metadata and
        # transaction verifications must not wait behind a <default> quota.
        self._super_users = super_users

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if (handler is None or not self._quotas.any_quota(REQUEST_PERCENTAGE) or method in _EXEMPT_METHODS
                or method.startswith(_EXEMPT_PREFIXES)):
            return handler
        if handler.unary_unary:
            return handler._replace(unary_unary=self._unary(handler.unary_unary))
        if handler.stream_unary:
            return handler._replace(stream_unary=self._unary(handler.stream_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._stream(handler.unary_stream))
        return handler._replace(stream_stream=self._stream(handler.stream_stream))

    def _exempt(self, context) -> bool:
        return bool(self._super_users) and principal_of_call(context) in self._super_users

    def _admit(self, context):
        who, go_on = self._quotas.hold(REQUEST_PERCENTAGE, context)
        if not go_on:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{THROTTLED_MARK} over its request_percentage quota: throttled for "
                          f"{self._quotas.owed_ms(REQUEST_PERCENTAGE, who)} ms more")
        return who

    def _charge(self, who, started_ns: int, response) -> None:
        """Charge the thread time since `started_ns`; a response with throttle_time_ms
        carries the larger of its throttles."""
        throttle_ms = self._quotas.charge(REQUEST_PERCENTAGE, who,
                                          (time.thread_time_ns() - started_ns) * PERCENT_SECONDS_PER_NS)
        if throttle_ms and hasattr(response, "throttle_time_ms"):
            response.throttle_time_ms = max(response.throttle_time_ms, throttle_ms)

    def _unary(self, behaviour):
        def call(request, context):
            if getattr(request, "is_replica", False) or self._exempt(context):
                return behaviour(request, context)        # a follower's fetch (replication), a broker's call
            who = self._admit(context)
            started_ns = time.thread_time_ns()
            response = behaviour(request, context)
            self._charge(who, started_ns, response)
            return response
        return call

    def _stream(self, behaviour):
        def call(request_or_iterator, context):
            if self._exempt(context):
                yield from behaviour(request_or_iterator, context)
                return
            responses = iter(behaviour(request_or_iterator, context))
            while True:
                # each message of a stream waits out what the entity owes, as a new call would
                who = self._admit(context)
                started_ns = time.thread_time_ns()
                try:
                    response = next(responses)
                except StopIteration:
                    self._charge(who, started_ns, None)
                    return
                self._charge(who, started_ns, response)
                yield response
        return call


def _text(value: float) -> str:
    """Kafka's kafka-configs writes a rate as a number; a whole one without '.0'."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _entity_to_json(entity: QuotaEntity) -> dict:
    return {USER: entity.user, CLIENT_ID: entity.client_id}


def _entity_from_json(item: dict) -> QuotaEntity:
    return check_entity(QuotaEntity(item.get(USER), item.get(CLIENT_ID)))


__all__ = ["ClientQuotas", "DEFAULT", "QuotaEntity", "QuotaError"]
