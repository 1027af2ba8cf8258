"""Client quotas, as Kafka's ClientQuotaManager keeps them: byte rates and request time per user and client id. Pure.

Theory of operation
-------------------
A quota is set on an *entity*: a user, a client id, or both, where either part may be a
name or `<default>` (every user / client id without a quota of its own). A request of user
U with client id C is governed by the first of these entities that has the quota key
(Kafka's order, most specific first):

    user=U, client-id=C      user=U, client-id=<default>      user=U
    user=<default>, client-id=C    user=<default>, client-id=<default>    user=<default>
    client-id=C              client-id=<default>

The quota is shared by everything that entity covers, and a default entity counts each user
or client id on its own: `user=<default>` gives every user its own allowance. So the rate
is measured per (key, the user if the entity names users, the client id if it names client
ids) -- Kafka's sensor tags.

Each rate is Kafka's Rate over `quota.window.num` (11) samples of `quota.window.size.seconds`
(1 s): the bytes in the samples still in the window, over the time they span but at least
(window.num - 1) windows, so a new client is measured over 10 s and a short burst passes.
When a request takes the rate over the bound, its throttle time is how long the client must
stay idle for the rate to fall back to the bound, (rate - bound) / bound * window span
(Kafka's QuotaUtils.throttleTime, not capped for byte rates). A fetch is cut to what one
window allows (`window_bytes_max`), or a large one would be refused again and again. Rates
with no sample left and holds that are over are swept once a window. The broker answers the request
at once with that `throttle_time_ms` (KIP-219) and holds the entity's next request until the
time is over (Kafka mutes the connection); a well-behaved client waits by itself.

`ClientQuotaManager.record(key, user, client_id, amount, now_ms)` takes the bytes of one
request and returns its throttle time; `delay_ms(...)` is how long a new request of that
entity must still wait. `replace_quotas` takes a new set of quotas (after an alteration);
rates measured so far are kept. No I/O, no locks: the broker's shell serializes calls.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple

PRODUCER_BYTE_RATE = "producer_byte_rate"
# Kafka's request quota (KIP-124): the share of one request-handler thread an entity's
# requests may take, in percent (200: two threads). Measured in percent-seconds of thread
# time per second; its throttle is capped at one window, as Kafka caps it.
REQUEST_PERCENTAGE = "request_percentage"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
DEFAULT = "<default>"
USER, CLIENT_ID = "user", "client-id"
QUOTA_WINDOW_NUM = 11                 # Kafka's quota.window.num
QUOTA_WINDOW_SIZE_MS = 1000           # Kafka's quota.window.size.seconds = 1


class QuotaError(ValueError):
    """A quota entity or value that Kafka would refuse; the message says which."""


class QuotaEntity(NamedTuple):
    """`user` and `client_id`: a name, DEFAULT, or None when the entity does not name one."""

    user: str | None = None
    client_id: str | None = None

    def describe(self) -> str:
        parts = [f"{kind}={value}" for kind, value in ((USER, self.user), (CLIENT_ID, self.client_id))
                 if value is not None]
        return ", ".join(parts)


def check_entity(entity: QuotaEntity) -> QuotaEntity:
    if entity.user is None and entity.client_id is None:
        raise QuotaError("a quota entity names a user, a client id, or both")
    if entity.user == "":
        raise QuotaError("a user entity needs a name (or the default)")
    return entity


def check_quota(key: str, value: float) -> float:
    if key not in QUOTA_KEYS:
        raise QuotaError(f"unknown quota {key!r} (eos enforces {', '.join(QUOTA_KEYS)})")
    if key == REQUEST_PERCENTAGE:
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise QuotaError(f"{key} must be a percentage of one thread above 0 (200: two threads), got {value!r}")
        return float(value)
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 1 and value == int(value)):
        raise QuotaError(f"{key} must be a whole number of bytes per second, at least 1, got {value!r}")
    return float(value)


def precedence(user: str, client_id: str) -> tuple[QuotaEntity, ...]:
    """The entities that may govern a request of `user` and `client_id`, most specific first."""
    return (QuotaEntity(user, client_id), QuotaEntity(user, DEFAULT), QuotaEntity(user, None),
            QuotaEntity(DEFAULT, client_id), QuotaEntity(DEFAULT, DEFAULT), QuotaEntity(DEFAULT, None),
            QuotaEntity(None, client_id), QuotaEntity(None, DEFAULT))


class _Rate:
    """Kafka's SampledStat Rate: `num` samples of `size_ms` each."""

    __slots__ = ("num", "size_ms", "samples")

    def __init__(self, num: int, size_ms: int):
        self.num = num
        self.size_ms = size_ms
        self.samples: list[list[float]] = []      # [window start ms, amount], oldest first

    def record(self, amount: float, now_ms: int) -> None:
        self._purge(now_ms)
        if not self.samples or now_ms >= self.samples[-1][0] + self.size_ms:
            self.samples.append([now_ms, 0.0])
        self.samples[-1][1] += amount

    def _purge(self, now_ms: int) -> None:
        # Kafka's purgeObsoleteSamples: a sample `num` windows old is gone
        while self.samples and now_ms - self.samples[0][0] >= self.num * self.size_ms:
            self.samples.pop(0)

    def span_ms(self, now_ms: int) -> float:
        """The time the samples cover, at least (num - 1) windows (Kafka's minimum)."""
        elapsed = now_ms - self.samples[0][0] if self.samples else 0
        return max(elapsed, (self.num - 1) * self.size_ms)

    def per_second(self, now_ms: int) -> float:
        self._purge(now_ms)
        return sum(amount for _, amount in self.samples) * 1000.0 / self.span_ms(now_ms)


class ClientQuotaManager:
    """See the module doc."""

    def __init__(self, quotas: Mapping[QuotaEntity, Mapping[str, float]] | None = None, *,
                 window_num: int = QUOTA_WINDOW_NUM, window_size_ms: int = QUOTA_WINDOW_SIZE_MS):
        self.window_num = window_num
        self.window_size_ms = window_size_ms
        self._quotas: dict[QuotaEntity, dict[str, float]] = {}
        self._rates: dict[tuple, _Rate] = {}
        self._held_until_ms: dict[tuple, int] = {}
        self._swept_at_ms = 0
        self.replace_quotas(quotas or {})

    @property
    def quotas(self) -> dict[QuotaEntity, dict[str, float]]:
        return {entity: dict(values) for entity, values in self._quotas.items()}

    def any_quota(self, key: str | None = None) -> bool:
        """Whether any entity has a quota (on `key`)."""
        return bool(self._quotas) if key is None else key in self._keys

    def replace_quotas(self, quotas: Mapping[QuotaEntity, Mapping[str, float]]) -> None:
        self._quotas = {check_entity(entity): {key: check_quota(key, value) for key, value in values.items()}
                        for entity, values in quotas.items() if values}
        self._keys = frozenset(key for values in self._quotas.values() for key in values)

    def governing(self, key: str, user: str, client_id: str) -> tuple[QuotaEntity, float] | None:
        """The entity whose `key` quota applies to this user and client id, and the bound."""
        for entity in precedence(user, client_id):
            bound = self._quotas.get(entity, {}).get(key)
            if bound is not None:
                return entity, bound
        return None

    def _sensor_key(self, key: str, entity: QuotaEntity, user: str, client_id: str) -> tuple:
        return (key, user if entity.user is not None else "", client_id if entity.client_id is not None else "")

    def _governing_sensor(self, key: str, user: str, client_id: str) -> tuple[tuple, float] | None:
        """(the sensor a request of this user and client id counts against, its bound)."""
        found = self.governing(key, user, client_id)
        return None if found is None else (self._sensor_key(key, found[0], user, client_id), found[1])

    def sensor(self, key: str, user: str, client_id: str) -> tuple | None:
        """The rate a request of this user and client id counts against (None: no quota)."""
        found = self._governing_sensor(key, user, client_id)
        return None if found is None else found[0]

    def record(self, key: str, user: str, client_id: str, amount: float, now_ms: int) -> int:
        """Count `amount` (bytes, or percent-seconds of thread time) of one request; its
        throttle time in ms (0: within the quota). A byte rate's is not capped (Kafka caps
        only request-time quotas, at one window): a request larger than a window's allowance
        earns the whole time it takes to pay it back."""
        found = self._governing_sensor(key, user, client_id)
        if found is None:
            return 0
        sensor_key, bound = found
        self._sweep(now_ms)
        rate = self._rates.get(sensor_key)
        if rate is None:
            rate = self._rates[sensor_key] = _Rate(self.window_num, self.window_size_ms)
        rate.record(amount, now_ms)
        observed = rate.per_second(now_ms)
        if observed <= bound:
            return 0
        throttle_ms = int((observed - bound) / bound * rate.span_ms(now_ms))
        if key == REQUEST_PERCENTAGE:
            throttle_ms = min(throttle_ms, self.window_size_ms)     # Kafka's maxThrottleTimeMs
        self._held_until_ms[sensor_key] = max(self._held_until_ms.get(sensor_key, 0), now_ms + throttle_ms)
        return throttle_ms

    def window_bytes_max(self, key: str, user: str, client_id: str) -> int | None:
        """The most bytes a window can allow (Kafka's getMaxValueInQuotaWindow: the bound over
        num - 1 windows): a fetch is cut to it, or one over it would never be answered."""
        found = self.governing(key, user, client_id)
        if found is None:
            return None
        return max(1, int(found[1] * (self.window_num - 1) * self.window_size_ms / 1000))

    def _sweep(self, now_ms: int) -> None:
        """Forget rates with no sample left and holds that are over (Kafka expires idle
        sensors), so clients that come and go leave nothing behind."""
        if now_ms - self._swept_at_ms < self.window_num * self.window_size_ms:
            return
        self._swept_at_ms = now_ms
        for sensor_key, rate in list(self._rates.items()):
            rate._purge(now_ms)
            if not rate.samples:
                del self._rates[sensor_key]
        self._held_until_ms = {k: until for k, until in self._held_until_ms.items() if until > now_ms}

    def unrecord(self, key: str, user: str, client_id: str, amount: float, now_ms: int) -> None:
        """Take back `amount` bytes counted for a request whose data was not sent after all
        (a throttled fetch is answered empty, Kafka's unrecordQuotaSensor)."""
        found = self._governing_sensor(key, user, client_id)
        rate = None if found is None else self._rates.get(found[0])
        if rate is not None:
            rate.record(-amount, now_ms)

    def delay_ms(self, key: str, user: str, client_id: str, now_ms: int) -> int:
        """How long a new request of this user and client id must wait (a throttle not over yet)."""
        found = self._governing_sensor(key, user, client_id)
        if found is None:
            return 0
        sensor_key = found[0]
        until = self._held_until_ms.get(sensor_key, 0)
        if until <= now_ms:
            self._held_until_ms.pop(sensor_key, None)
            return 0
        return until - now_ms

    def rate(self, key: str, user: str, client_id: str, now_ms: int) -> float:
        """The measured bytes/s of the sensor governing this user and client id (0 if none)."""
        found = self._governing_sensor(key, user, client_id)
        rate = None if found is None else self._rates.get(found[0])
        return 0.0 if rate is None else rate.per_second(now_ms)
