"""One gRPC server per group of listeners, so a call's listener is always known.

Theory of operation
-------------------
gRPC tells a handler the transport security of the connection a call came in on
("insecure" or "ssl"), not the port. A server whose listeners differ in transport therefore
knows each call's listener; two listeners of one transport (SSL and SASL_SSL, or an
INTERNAL and an EXTERNAL SSL listener, as Kafka allows) cannot share a server. So the
broker's listeners are split into groups (`group_listeners`, pure): each listener joins the
first group without a listener of its transport, in the order given -- one group, one
server, for every broker with at most one clear and one TLS listener, as before; a second
server only when a second listener of a transport needs one.

`ServerGroup` stands for the servers where the generated `add_*Servicer_to_server`
functions and the broker's start and stop take one server: each service (the same servicer
object) is added to every server, so all listeners serve everything and share all state;
each server has its own worker pool sized by rpc_pool_limits (threads are made on demand)
and its own identity interceptor, which knows that server's listeners only.

The servers serve before the broker's logs are recovered, so that the gRPC health service
can say NOT_SERVING while they are (a large log takes minutes), as an operator's probe
expects, instead of a refused connection. The broker's own services are made only once the
logs are open, so they are added to `LateServices`, the one generic handler the servers
hold besides health and reflection: until `open()` it answers every call UNAVAILABLE
("loading"), which clients retry as they retry a broker that is not up yet; after, it hands
each call to its service's handler (one dict lookup).
"""
from __future__ import annotations

from typing import Iterable

import grpc

from broker.security import Listener, transport_of


def group_listeners(listeners: Iterable[Listener]) -> list[tuple[Listener, ...]]:
    """Listeners split so no group holds two of one transport (see the module doc)."""
    groups: list[list[Listener]] = []
    for listener in listeners:
        transport = transport_of(listener.security_protocol)
        for group in groups:
            if all(transport_of(member.security_protocol) != transport for member in group):
                group.append(listener)
                break
        else:
            groups.append([listener])
    return [tuple(group) for group in groups]


def _loading(request_iterator, context):
    context.abort(grpc.StatusCode.UNAVAILABLE, "the broker is starting: its logs and coordinators are loading")


_SERVED_FROM_THE_START = ("/grpc.health.v1.Health/", "/grpc.reflection.")
# A stream-stream handler reads nothing before it aborts, so it answers a call of any shape.
_LOADING_HANDLER = grpc.stream_stream_rpc_method_handler(_loading)


class LateServices(grpc.GenericRpcHandler):
    """Services added while the servers already serve (see the module doc). It has the face
    the generated add_*Servicer_to_server functions use, so services are added to it as to
    a server."""

    def __init__(self):
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._open = False

    def add_generic_rpc_handlers(self, handlers) -> None:
        """Ignored: the generated functions give the same handlers to add_registered_method_handlers."""

    def add_registered_method_handlers(self, service_name: str, method_handlers) -> None:
        for method, handler in method_handlers.items():
            self._handlers[f"/{service_name}/{method}"] = handler

    def open(self) -> None:
        self._open = True

    def service(self, handler_call_details):
        if not self._open:
            # health and reflection are the servers' own, registered before they started
            return None if handler_call_details.method.startswith(_SERVED_FROM_THE_START) else _LOADING_HANDLER
        return self._handlers.get(handler_call_details.method)


class _AllStopped:
    """What grpc.Server.stop returns (an event to wait on), for several servers."""

    def __init__(self, events):
        self._events = events

    def wait(self, timeout: float | None = None) -> bool:
        return all(event.wait(timeout) for event in self._events)


class ServerGroup:
    """Several grpc.Servers used as one (see the module doc)."""

    def __init__(self, servers: list[grpc.Server]):
        self.servers = servers

    def add_generic_rpc_handlers(self, handlers) -> None:
        for server in self.servers:
            server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service_name, method_handlers) -> None:
        for server in self.servers:
            server.add_registered_method_handlers(service_name, method_handlers)

    def start(self) -> None:
        for server in self.servers:
            server.start()

    def stop(self, grace: float | None) -> _AllStopped:
        return _AllStopped([server.stop(grace) for server in self.servers])
