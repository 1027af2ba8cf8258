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

The credentials RPCs are Kafka's (KIP-554) over `ScramUsers`: an alteration carries the
salt and salted password the client computed; the broker derives StoredKey and ServerKey
and keeps only those. With an authorizer, altering needs ALTER on the cluster and
describing DESCRIBE on the cluster; without one anybody who reached the broker may, as in
Kafka.
"""
from __future__ import annotations

import logging

from broker.acl import Operation, ResourceType
from eos.errors import ErrorCode
from eos.scram import MECHANISMS, ScramError, ScramServer, check_iterations, credential_from_salted
from eos.v1 import security_pb2, security_pb2_grpc

log = logging.getLogger("eos.broker.sasl")


class SecurityServicer(security_pb2_grpc.SecurityServicer):
    def __init__(self, users, tokens, *, enabled_mechanisms: tuple[str, ...], authorizer=None):
        self._users = users
        self._tokens = tokens
        self._enabled = enabled_mechanisms
        self._authorizer = authorizer

    # ---- authentication ----------------------------------------------------------------------

    def SaslAuthenticate(self, request_iterator, context):
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
        exchange = ScramServer(first.mechanism, lambda user: self._users.credential(user, first.mechanism))
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


def _alter_results(users, code: ErrorCode, message: str):
    return security_pb2.AlterUserScramCredentialsResponse(results=[
        security_pb2.AlterUserScramCredentialsResult(user=u, error_code=code, error_message=message) for u in users])


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("the SCRAM message is not UTF-8") from None
