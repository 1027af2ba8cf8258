"""The Security service: the SCRAM exchange over gRPC, and the users' SCRAM credentials.

Theory of operation
-------------------
`SaslAuthenticate` is one bidirectional stream per exchange: the client's first message
names the mechanism and carries client-first; the broker answers server-first; the
client's second carries client-final; the broker checks the proof (eos/scram.py, the pure
exchange) and answers server-final with a session token bound to the call's connection
(`broker/scram_users.SessionTokens`). A failure answers SASL_AUTHENTICATION_FAILED (a wrong
password and an unknown user read the same), UNSUPPORTED_SASL_MECHANISM or
ILLEGAL_SASL_STATE and ends the stream; nothing else changes. Failures are logged at INFO
with the user and the peer, as Kafka's authenticator logs them.

The client-quota RPCs are Kafka's (KIP-546) over `broker/client_quotas.ClientQuotas`: an
alteration is checked whole and written at once, or not at all.

The credentials RPCs are Kafka's (KIP-554) over `ScramUsers`: an alteration carries the
salt and salted password the client computed; the broker derives StoredKey and ServerKey
and keeps only those. With an authorizer, altering needs ALTER on the cluster and
describing DESCRIBE on the cluster; without one anybody who reached the broker may, as in
Kafka.
"""
from __future__ import annotations

import logging
import threading

import grpc

from broker.acl import Operation, ResourceType
from broker.quotas import CLIENT_ID, DEFAULT, USER, QuotaEntity, QuotaError, check_entity
from broker.security import PLAINTEXT, current_call, is_loopback
from eos.errors import ErrorCode
from eos.scram import MECHANISMS, ScramError, ScramServer, check_iterations, credential_from_salted
from eos.v1 import security_pb2, security_pb2_grpc

log = logging.getLogger("eos.broker.sasl")

SASL_EXCHANGES_MAX = 32          # SCRAM exchanges in progress at once
SASL_EXCHANGE_TIMEOUT_S = 10.0   # from the first message to the last


class SecurityServicer(security_pb2_grpc.SecurityServicer):
    """`users` the broker's SCRAM credentials (ScramUsers, or ZkScramUsers on a cluster),
    `quotas` its ClientQuotas."""

    def __init__(self, users, tokens, *, enabled_mechanisms: tuple[str, ...], authorizer=None, quotas=None,
                 sasl_listener: bool = True,
                 exchanges_max: int = SASL_EXCHANGES_MAX, exchange_timeout_s: float = SASL_EXCHANGE_TIMEOUT_S):
        self._users = users
        self._tokens = tokens
        self._enabled = enabled_mechanisms
        self._authorizer = authorizer
        self._quotas = quotas
        self._sasl_listener = sasl_listener
        # Each exchange holds a gRPC worker while it waits for the client's next message:
        # bounded in number and in time, so clients that never finish cannot starve the broker.
        self._exchanges = threading.BoundedSemaphore(exchanges_max)
        self._exchange_timeout_s = exchange_timeout_s

    # ---- authentication ----------------------------------------------------------------------

    def SaslAuthenticate(self, request_iterator, context):
        if not self._sasl_listener:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this broker has no SASL_SSL listener")
        if not self._exchanges.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many SASL authentications in progress; "
                                                              "try again")
        timer = threading.Timer(self._exchange_timeout_s, context.cancel)   # a client that stalls is cut off
        timer.daemon = True
        timer.start()
        try:
            yield from self._exchange(request_iterator, context)
        except grpc.RpcError:          # cancelled: the time limit, or the client went away
            log.info("SASL authentication from %s ended before it finished (over %.0f s, or the client left)",
                     context.peer(), self._exchange_timeout_s)
        finally:
            timer.cancel()
            self._exchanges.release()

    def _credential(self, user: str, mechanism: str):
        try:
            return self._users.credential(user, mechanism)
        except ScramError as exc:     # the file is unreadable: the operator's problem, not the client's to see
            log.error("SASL authentication of %r: %s", user, exc)
            raise ScramError("the broker cannot read its SCRAM credentials") from None

    def _exchange(self, request_iterator, context):
        def refused(code: ErrorCode, message: str) -> security_pb2.SaslAuthenticateResponse:
            log.info("SASL authentication from %s refused: %s", context.peer(), message)
            return security_pb2.SaslAuthenticateResponse(error_code=code, error_message=message)

        first = next(request_iterator, None)
        if first is None:
            return
        if first.mechanism not in self._enabled:
            yield refused(ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                          f"SASL mechanism {first.mechanism!r} is not enabled on this broker "
                          f"(sasl.enabled.mechanisms={','.join(self._enabled)})")
            return
        exchange = ScramServer(first.mechanism, lambda user: self._credential(user, first.mechanism))
        try:
            yield security_pb2.SaslAuthenticateResponse(auth_bytes=exchange.first(_text(first.auth_bytes)).encode())
        except ScramError as exc:
            yield refused(ErrorCode.ILLEGAL_SASL_STATE, str(exc))
            return
        final = next(request_iterator, None)
        if final is None:
            return
        try:
            server_final = exchange.final(_text(final.auth_bytes))
        except ScramError as exc:
            yield refused(ErrorCode.SASL_AUTHENTICATION_FAILED,
                          f"authentication failed: invalid credentials with SASL mechanism {first.mechanism}"
                          if exchange.username is not None and "authentication failed" in str(exc) else str(exc))
            return
        token = self._tokens.issue(f"User:{exchange.username}", context.peer())
        yield security_pb2.SaslAuthenticateResponse(auth_bytes=server_final.encode(), session_token=token,
                                                    session_lifetime_ms=self._tokens.lifetime_ms)

    # ---- credentials ---------------------------------------------------------------------------

    def _cluster_refusal(self, operation: Operation) -> str | None:
        if self._authorizer is None:
            return None
        return self._authorizer.refusal(operation, ResourceType.CLUSTER)

    def AlterUserScramCredentials(self, request, context):
        users = sorted({d.name for d in request.deletions} | {u.name for u in request.upsertions})
        refusal = self._cluster_refusal(Operation.ALTER)
        if refusal is not None:
            return _alter_results(users, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, refusal)
        call = current_call()
        if (request.upsertions and call is not None and call.listener.security_protocol == PLAINTEXT
                and not is_loopback(call.host)):
            # a salted password is as good as the password to whoever reads it on the way
            return _alter_results(users, ErrorCode.INVALID_REQUEST,
                                  "SCRAM credentials are set over TLS (SSL or SASL_SSL) or from this machine only")
        try:
            upsertions = {}
            for item in request.upsertions:
                if not item.name:
                    raise ValueError("a user name is required")
                if item.mechanism not in MECHANISMS:
                    raise ValueError(f"unsupported SASL mechanism {item.mechanism!r}")
                if not item.salt or not item.salted_password:
                    raise ValueError(f"user {item.name!r}: a salt and a salted password are required")
                upsertions[(item.name, item.mechanism)] = credential_from_salted(
                    item.mechanism, item.salted_password, item.salt, check_iterations(item.iterations))
            deletions = {(d.name, d.mechanism) for d in request.deletions}
            if deletions & set(upsertions):
                raise ValueError("a user's credential cannot be deleted and set in one request")
            self._users.alter(upsertions, deletions)
            for user, _ in deletions:       # a deleted user's sessions end now, not at their expiry
                self._tokens.revoke(f"User:{user}")
        except KeyError as exc:
            return _alter_results(users, ErrorCode.RESOURCE_NOT_FOUND, str(exc.args[0]))
        except (ValueError, ScramError) as exc:
            return _alter_results(users, ErrorCode.INVALID_REQUEST, str(exc))
        log.info("SCRAM credentials altered: %d set, %d deleted (users %s)", len(upsertions), len(deletions), users)
        return _alter_results(users, ErrorCode.NONE, "")

    def DescribeUserScramCredentials(self, request, context):
        refusal = self._cluster_refusal(Operation.DESCRIBE)
        if refusal is not None:
            return security_pb2.DescribeUserScramCredentialsResponse(
                error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=refusal)
        known = self._users.describe()
        asked = list(request.users) or sorted(known)
        results = []
        for user in asked:
            mechanisms = known.get(user)
            if not mechanisms:
                results.append(security_pb2.DescribeUserScramCredentialsResult(
                    user=user, error_code=ErrorCode.RESOURCE_NOT_FOUND,
                    error_message=f"attempt to describe a user credential that does not exist: {user}"))
                continue
            results.append(security_pb2.DescribeUserScramCredentialsResult(user=user, credential_infos=[
                security_pb2.CredentialInfo(mechanism=m, iterations=i) for m, i in sorted(mechanisms.items())]))
        return security_pb2.DescribeUserScramCredentialsResponse(results=results)


    # ---- client quotas ---------------------------------------------------------------------------

    def AlterClientQuotas(self, request, context):
        def answer(code: ErrorCode, message: str, problems: dict[int, str] | None = None):
            return security_pb2.AlterClientQuotasResponse(results=[
                security_pb2.AlterClientQuotasResult(
                    error_code=ErrorCode.INVALID_REQUEST if problems and i in problems else code,
                    error_message=(problems or {}).get(i, message), entity=entry.entity)
                for i, entry in enumerate(request.entries)])

        refusal = self._cluster_refusal(Operation.ALTER_CONFIGS)
        if refusal is not None:
            return answer(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, refusal)
        alterations, problems = [], {}
        for index, entry in enumerate(request.entries):
            try:
                alterations.append((_entity_from_proto(entry.entity),
                                    {op.key: None if op.remove else op.value for op in entry.ops}))
                self._quotas.alter(alterations[-1:], validate_only=True)
            except QuotaError as exc:
                problems[index] = str(exc)
        if problems:   # all or none, as one write
            return answer(ErrorCode.OPERATION_NOT_ATTEMPTED,
                          "nothing was changed: another entry of the request was refused", problems)
        self._quotas.alter(alterations, validate_only=request.validate_only)
        if not request.validate_only:
            log.info("client quotas altered: %s", "; ".join(
                f"{entity.describe()} {changes}" for entity, changes in alterations))
        return answer(ErrorCode.NONE, "")

    def DescribeClientQuotas(self, request, context):
        refusal = self._cluster_refusal(Operation.DESCRIBE_CONFIGS)
        if refusal is not None:
            return security_pb2.DescribeClientQuotasResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                                             error_message=refusal)
        return security_pb2.DescribeClientQuotasResponse(entries=[
            security_pb2.QuotaEntry(entity=_entity_to_proto(entity), values=values)
            for entity, values in sorted(self._quotas.describe().items(), key=lambda item: item[0].describe())])


def _entity_from_proto(components) -> QuotaEntity:
    found: dict[str, str] = {}
    for component in components:
        if component.entity_type not in (USER, CLIENT_ID):
            raise QuotaError(f"unknown quota entity type {component.entity_type!r} (user or client-id)")
        if component.entity_type in found:
            raise QuotaError(f"the entity names {component.entity_type} twice")
        found[component.entity_type] = DEFAULT if component.is_default else component.name
    return check_entity(QuotaEntity(found.get(USER), found.get(CLIENT_ID)))


def _entity_to_proto(entity: QuotaEntity) -> list:
    return [security_pb2.QuotaEntityComponent(entity_type=kind, name="" if value == DEFAULT else value,
                                              is_default=value == DEFAULT)
            for kind, value in ((USER, entity.user), (CLIENT_ID, entity.client_id)) if value is not None]


def _alter_results(users, code: ErrorCode, message: str):
    return security_pb2.AlterUserScramCredentialsResponse(results=[
        security_pb2.AlterUserScramCredentialsResult(user=u, error_code=code, error_message=message) for u in users])


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("the SCRAM message is not UTF-8") from None
