"""A client channel's SASL/SCRAM session: authenticate once per connection, then tag every call.

Theory of operation
-------------------
A channel to a SASL_SSL listener is wrapped by `SaslChannelInterceptor`. Before its first
call it runs the SCRAM exchange (`eos/scram.py`) over the Security service's
SaslAuthenticate stream on the same channel, and keeps the session token the broker
returns. Every call then carries the token in the `eos-sasl-token` metadata key; the broker
accepts it only on the connection it was issued on.

The token stops working when the channel reconnects (a new connection) or its lifetime
ends. The broker then answers UNAUTHENTICATED with the "[reauthenticate]" mark; the
interceptor drops the token when such an answer completes a call (a done-callback, so
`.future()` calls stay asynchronous) and the client's usual retry of a retriable error
(`error_from_rpc` maps the mark to NetworkError) authenticates again. A token is also
renewed before its lifetime ends. A refused authentication (wrong password, unknown user,
mechanism not enabled) fails the call with UNAUTHENTICATED without the mark, which clients
raise as SaslAuthenticationError and do not retry.
"""
from __future__ import annotations

import threading
import time
from typing import NamedTuple

import grpc

from eos.errors import ErrorCode
from eos.scram import ScramClient, ScramError

SASL_TOKEN_KEY = "eos-sasl-token"                 # the broker's broker/security.py reads this key
REAUTHENTICATE_MARK = "[reauthenticate]"
AUTHENTICATE_TIMEOUT_S = 30.0
RENEW_AT_FRACTION = 0.9                           # of the session's lifetime


class SaslSettings(NamedTuple):
    mechanism: str
    username: str
    password: str

    def __repr__(self) -> str:       # never the password, in a log or a traceback
        return f"SaslSettings(mechanism={self.mechanism!r}, username={self.username!r}, password=***)"


class AuthenticationRefused(grpc.RpcError):
    """The SCRAM exchange failed: raised from the call that needed it. UNAUTHENTICATED when
    the broker refused it (not retried); DEADLINE_EXCEEDED when it could not finish in the
    call's time (retried as the call would be)."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED):
        super().__init__(message)
        self._message = message
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return self._message


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: tuple | None
    credentials: object
    wait_for_ready: bool | None
    compression: object


class SaslChannelInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                             grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """See the module doc. One per channel; thread-safe."""

    def __init__(self, channel: grpc.Channel, settings: SaslSettings):
        from eos.v1 import security_pb2_grpc
        self._stub = security_pb2_grpc.SecurityStub(channel)
        self._settings = settings
        # Two locks: `_lock` guards the token and is never held across I/O (gRPC's channel
        # thread takes it in `_drop`, and that thread is the one that delivers the exchange's
        # answers); `_authenticating` lets one thread at a time run the exchange.
        self._lock = threading.Lock()
        self._authenticating = threading.Lock()
        self._token: str | None = None
        self._renew_at_s = 0.0

    # ---- the session ---------------------------------------------------------------------------

    def _valid_token(self) -> str | None:
        with self._lock:
            return self._token if self._token is not None and time.monotonic() < self._renew_at_s else None

    def token(self, timeout_s: float | None = None) -> str:
        """The session's token, authenticating first if there is none (within `timeout_s`,
        the call's own deadline, at most AUTHENTICATE_TIMEOUT_S)."""
        token = self._valid_token()
        if token is not None:
            return token
        budget_s = AUTHENTICATE_TIMEOUT_S if timeout_s is None else max(0.001, min(timeout_s, AUTHENTICATE_TIMEOUT_S))
        deadline_s = time.monotonic() + budget_s
        if not self._authenticating.acquire(timeout=budget_s):
            raise AuthenticationRefused("SASL authentication by another call did not finish in time",
                                        grpc.StatusCode.DEADLINE_EXCEEDED)
        try:
            token = self._valid_token()      # another call may have just authenticated
            if token is not None:
                return token
            token, lifetime_ms = self._authenticate(max(0.001, deadline_s - time.monotonic()))
            with self._lock:
                self._token = token
                self._renew_at_s = time.monotonic() + lifetime_ms / 1000.0 * RENEW_AT_FRACTION
            return token
        finally:
            self._authenticating.release()

    def _drop(self, token: str) -> None:
        with self._lock:
            if self._token == token:
                self._token = None

    def _authenticate(self, timeout_s: float) -> tuple[str, int]:
        from eos.v1 import security_pb2
        settings = self._settings
        exchange = ScramClient(settings.mechanism, settings.username, settings.password)
        outgoing: list = [security_pb2.SaslAuthenticateRequest(mechanism=settings.mechanism,
                                                                auth_bytes=exchange.first().encode())]
        ready = threading.Condition()

        def requests():
            sent = 0
            while True:
                with ready:
                    ready.wait_for(lambda: len(outgoing) > sent, timeout=timeout_s)
                    if len(outgoing) <= sent or outgoing[sent] is None:
                        return
                    item = outgoing[sent]
                sent += 1
                yield item

        answers = self._stub.SaslAuthenticate(requests(), timeout=timeout_s)
        try:
            server_first = self._answer(next(answers, None))
            try:
                client_final = exchange.final(server_first.auth_bytes.decode("utf-8"))
            except (ScramError, UnicodeDecodeError) as exc:
                raise AuthenticationRefused(f"SASL authentication failed: {exc}") from None
            with ready:
                outgoing.append(security_pb2.SaslAuthenticateRequest(auth_bytes=client_final.encode()))
                ready.notify_all()
            server_final = self._answer(next(answers, None))
            try:
                exchange.check_server_final(server_final.auth_bytes.decode("utf-8"))
            except (ScramError, UnicodeDecodeError) as exc:
                raise AuthenticationRefused(f"SASL authentication failed: {exc}") from None
            if not server_final.session_token:
                raise AuthenticationRefused("SASL authentication failed: the broker issued no session token")
            return server_final.session_token, server_final.session_lifetime_ms or 3_600_000
        finally:
            with ready:
                outgoing.append(None)
                ready.notify_all()
            answers.cancel()

    def _answer(self, response):
        if response is None:
            raise AuthenticationRefused("SASL authentication failed: the broker ended the exchange")
        if response.error_code != ErrorCode.NONE:
            raise AuthenticationRefused(f"SASL authentication failed ({ErrorCode(response.error_code).name}): "
                                        f"{response.error_message}")
        return response

    # ---- the calls -----------------------------------------------------------------------------

    def _tagged(self, details) -> tuple[_CallDetails, str]:
        token = self.token(details.timeout)
        metadata = tuple(details.metadata or ()) + ((SASL_TOKEN_KEY, token),)
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            details.wait_for_ready, details.compression), token

    def _watch(self, outcome, token: str):
        """Drop the token when the broker says it does not know it on this connection."""
        def done(call):
            try:
                code, message = call.code(), call.details() or ""
            except Exception:
                return
            if code is grpc.StatusCode.UNAUTHENTICATED and message.startswith(REAUTHENTICATE_MARK):
                self._drop(token)
        try:
            outcome.add_done_callback(done)
        except Exception:
            pass
        return outcome

    def _intercept(self, continuation, client_call_details, request_or_iterator):
        details, token = self._tagged(client_call_details)
        return self._watch(continuation(details, request_or_iterator), token)

    # the same for the four kinds of call: tag it, watch its end
    intercept_unary_unary = intercept_unary_stream = _intercept
    intercept_stream_unary = intercept_stream_stream = _intercept
