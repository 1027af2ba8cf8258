"""The controller's connections to the brokers: one ordered sender thread per broker.

Theory of operation
-------------------
Kafka's ControllerChannelManager: every live broker gets a queue and a thread that sends
the controller's requests (LeaderAndIsr, UpdateMetadata, StopReplica) to it one at a time,
in the order the controller decided them, so a broker never applies an older decision
after a newer one. A request that fails on the network is retried (with a short backoff)
until it succeeds, the broker leaves the live set (`remove_broker`), or the controller
resigns (`close`); a broker restarted meanwhile gets a fresh queue and the controller
resends it everything it needs. A dead broker's queue never blocks another's.

Responses are handed to `on_response(broker_id, rpc_name, response, request)` on the sender thread;
the controller turns the interesting ones (errors) into events on its own queue.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

import grpc

from eos.client_config import ChannelSecurity
from eos.net import open_channel
from eos.v1 import cluster_pb2_grpc

log = logging.getLogger("eos.controller.channels")

SEND_TIMEOUT_S = 10.0
RETRY_BACKOFF_S = 0.2
QUEUE_MAX = 10_000


class _BrokerSender(threading.Thread):
    def __init__(self, broker_id: int, address: str, on_response: Callable, security: ChannelSecurity | None):
        super().__init__(name=f"eos-controller-send-{broker_id}", daemon=True)
        self.broker_id = broker_id
        self.address = address
        self._on_response = on_response
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_MAX)
        self._stopping = threading.Event()
        self._channel = open_channel(address, security)
        self._stub = cluster_pb2_grpc.ClusterStub(self._channel)

    def send(self, rpc_name: str, request) -> None:
        try:
            self._queue.put_nowait((rpc_name, request))
        except queue.Full:
            log.error("controller queue to broker %d is full; dropping %s (the broker will be resent "
                      "its state when it re-registers)", self.broker_id, rpc_name)

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                rpc_name, request = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            while not self._stopping.is_set():
                try:
                    response = getattr(self._stub, rpc_name)(request, timeout=SEND_TIMEOUT_S)
                except grpc.RpcError as exc:
                    log.info("%s to broker %d at %s failed (%s); retrying", rpc_name, self.broker_id,
                             self.address, exc.code())
                    self._stopping.wait(RETRY_BACKOFF_S)
                    continue
                try:
                    self._on_response(self.broker_id, rpc_name, response, request)
                except Exception:
                    log.exception("handling the %s response of broker %d", rpc_name, self.broker_id)
                break

    def close(self) -> None:
        self._stopping.set()
        self.join(SEND_TIMEOUT_S + 1)
        self._channel.close()


class ControllerChannels:
    """Sender threads by broker id; see the module doc."""

    def __init__(self, on_response: Callable[[int, str, object, object], None], security: ChannelSecurity | None = None):
        self._on_response = on_response
        self._security = security      # the inter-broker listener's protocol
        self._senders: dict[int, _BrokerSender] = {}
        self._lock = threading.Lock()

    def set_brokers(self, addresses: dict[int, str]) -> None:
        """Keep senders for exactly these brokers (a changed address gets a new sender)."""
        with self._lock:
            stale = [b for b, s in self._senders.items() if addresses.get(b) != s.address]
            closing = [self._senders.pop(b) for b in stale]
            for broker_id, address in addresses.items():
                if broker_id not in self._senders:
                    sender = _BrokerSender(broker_id, address, self._on_response, self._security)
                    self._senders[broker_id] = sender
                    sender.start()
        for sender in closing:
            threading.Thread(target=sender.close, daemon=True).start()

    def send(self, broker_id: int, rpc_name: str, request) -> None:
        with self._lock:
            sender = self._senders.get(broker_id)
        if sender is None:
            log.debug("no sender for broker %d (not live); %s dropped", broker_id, rpc_name)
            return
        sender.send(rpc_name, request)

    def close(self) -> None:
        with self._lock:
            senders = list(self._senders.values())
            self._senders.clear()
        for sender in senders:
            sender.close()
