"""Error codes and exceptions, with what a client does about each.

Theory of operation
-------------------
The wire carries Kafka's error codes (proto `eos.v1.ErrorCode`, same names and numbers).
Every code maps to one exception class here and to one of three client reactions:

- RETRY: a passing condition (a leader moving, a coordinator loading, a timeout). The
  client backs off and sends again; for an idempotent producer the retry is safe.
- ABORT: the transaction cannot commit, but the producer is healthy. The application calls
  abort_transaction() and carries on.
- FATAL: the producer or the request is wrong for good (fenced, invalid config, bad
  input). The application must close the producer or fix its input.

This module is part of the kernel: it imports nothing else of ours (the generated enum is
read lazily, so `broker.storage` can raise these without importing protobuf).
"""
from __future__ import annotations

import enum


class Reaction(enum.Enum):
    RETRY = "retry"
    ABORT = "abort"
    FATAL = "fatal"


class ErrorCode(enum.IntEnum):
    """Kafka's codes, mirrored from proto/eos/v1/common.proto (a test keeps them equal)."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    STALE_CONTROLLER_EPOCH = 11
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    REASSIGNMENT_IN_PROGRESS = 60
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    NO_REASSIGNMENT_IN_PROGRESS = 85
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    THROTTLING_QUOTA_EXCEEDED = 89
    PRODUCER_FENCED = 90
    RESOURCE_NOT_FOUND = 91
    INCONSISTENT_CLUSTER_ID = 104
    TRANSACTIONAL_ID_NOT_FOUND = 105
    TRANSACTION_ABORTABLE = 120


_RETRIABLE = {
    ErrorCode.CORRUPT_MESSAGE,  # Kafka retries it: a bit flip on the wire, the next send may be whole
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,  # metadata may still be propagating
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.BROKER_NOT_AVAILABLE,
    ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.CONCURRENT_TRANSACTIONS,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.UNSTABLE_OFFSET_COMMIT,
    ErrorCode.THROTTLING_QUOTA_EXCEEDED,       # a client quota: try again after throttle_time_ms
    ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.NOT_CONTROLLER,                   # the controller moved: ask the new one
    ErrorCode.FETCH_SESSION_ID_NOT_FOUND,       # the leader forgot the session: a full fetch starts another
    ErrorCode.INVALID_FETCH_SESSION_EPOCH,
    ErrorCode.FENCED_LEADER_EPOCH,              # the client's metadata is older than the leader's
    ErrorCode.UNKNOWN_LEADER_EPOCH,             # the client's metadata is newer than the broker's
    ErrorCode.OFFSET_NOT_AVAILABLE,             # a new leader's high watermark is not caught up yet
    ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
    ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
}
_ABORTABLE = {
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    ErrorCode.UNKNOWN_PRODUCER_ID,
    ErrorCode.INVALID_RECORD,
    ErrorCode.MESSAGE_TOO_LARGE,
    ErrorCode.RECORD_LIST_TOO_LARGE,
    ErrorCode.INVALID_TIMESTAMP,
    ErrorCode.ILLEGAL_GENERATION,
    ErrorCode.UNKNOWN_MEMBER_ID,
    ErrorCode.TRANSACTION_ABORTABLE,
}


def reaction_for(code: int) -> Reaction:
    code = ErrorCode(code)
    if code in _RETRIABLE:
        return Reaction.RETRY
    if code in _ABORTABLE:
        return Reaction.ABORT
    return Reaction.FATAL


class EosError(Exception):
    """Base of every eos error. `code` is the Kafka error code it stands for."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", code: int | None = None):
        if code is not None:
            self.code = ErrorCode(code)
        super().__init__(message or self.code.name)

    @property
    def retriable(self) -> bool:
        return reaction_for(self.code) is Reaction.RETRY

    @property
    def abortable(self) -> bool:
        return reaction_for(self.code) is Reaction.ABORT

    @property
    def fatal(self) -> bool:
        return reaction_for(self.code) is Reaction.FATAL


def _error_class(name: str, code: ErrorCode) -> type[EosError]:
    return type(name, (EosError,), {"code": code, "__doc__": f"Kafka error {code.name} ({int(code)})."})


CorruptRecordError = _error_class("CorruptRecordError", ErrorCode.CORRUPT_MESSAGE)
InvalidRecordError = _error_class("InvalidRecordError", ErrorCode.INVALID_RECORD)
OffsetOutOfRangeError = _error_class("OffsetOutOfRangeError", ErrorCode.OFFSET_OUT_OF_RANGE)
UnknownTopicOrPartitionError = _error_class("UnknownTopicOrPartitionError", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
MessageTooLargeError = _error_class("MessageTooLargeError", ErrorCode.MESSAGE_TOO_LARGE)
RecordListTooLargeError = _error_class("RecordListTooLargeError", ErrorCode.RECORD_LIST_TOO_LARGE)
InvalidTopicError = _error_class("InvalidTopicError", ErrorCode.INVALID_TOPIC_EXCEPTION)
TopicAlreadyExistsError = _error_class("TopicAlreadyExistsError", ErrorCode.TOPIC_ALREADY_EXISTS)
InvalidPartitionsError = _error_class("InvalidPartitionsError", ErrorCode.INVALID_PARTITIONS)
InvalidConfigError = _error_class("InvalidConfigError", ErrorCode.INVALID_CONFIG)
InvalidRequestError = _error_class("InvalidRequestError", ErrorCode.INVALID_REQUEST)
InvalidRequiredAcksError = _error_class("InvalidRequiredAcksError", ErrorCode.INVALID_REQUIRED_ACKS)
InvalidTimestampError = _error_class("InvalidTimestampError", ErrorCode.INVALID_TIMESTAMP)
RequestTimedOutError = _error_class("RequestTimedOutError", ErrorCode.REQUEST_TIMED_OUT)
NetworkError = _error_class("NetworkError", ErrorCode.NETWORK_EXCEPTION)
StorageError = _error_class("StorageError", ErrorCode.KAFKA_STORAGE_ERROR)
OutOfOrderSequenceError = _error_class("OutOfOrderSequenceError", ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
DuplicateSequenceError = _error_class("DuplicateSequenceError", ErrorCode.DUPLICATE_SEQUENCE_NUMBER)
InvalidProducerEpochError = _error_class("InvalidProducerEpochError", ErrorCode.INVALID_PRODUCER_EPOCH)
UnknownProducerIdError = _error_class("UnknownProducerIdError", ErrorCode.UNKNOWN_PRODUCER_ID)
ProducerFencedError = _error_class("ProducerFencedError", ErrorCode.PRODUCER_FENCED)
InvalidTxnStateError = _error_class("InvalidTxnStateError", ErrorCode.INVALID_TXN_STATE)
NotLeaderOrFollowerError = _error_class("NotLeaderOrFollowerError", ErrorCode.NOT_LEADER_OR_FOLLOWER)
LeaderNotAvailableError = _error_class("LeaderNotAvailableError", ErrorCode.LEADER_NOT_AVAILABLE)
NotEnoughReplicasError = _error_class("NotEnoughReplicasError", ErrorCode.NOT_ENOUGH_REPLICAS)
NotEnoughReplicasAfterAppendError = _error_class("NotEnoughReplicasAfterAppendError",
                                                 ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
StaleControllerEpochError = _error_class("StaleControllerEpochError", ErrorCode.STALE_CONTROLLER_EPOCH)
NotControllerError = _error_class("NotControllerError", ErrorCode.NOT_CONTROLLER)
FencedLeaderEpochError = _error_class("FencedLeaderEpochError", ErrorCode.FENCED_LEADER_EPOCH)
UnknownLeaderEpochError = _error_class("UnknownLeaderEpochError", ErrorCode.UNKNOWN_LEADER_EPOCH)
InvalidReplicationFactorError = _error_class("InvalidReplicationFactorError", ErrorCode.INVALID_REPLICATION_FACTOR)
InvalidReplicaAssignmentError = _error_class("InvalidReplicaAssignmentError", ErrorCode.INVALID_REPLICA_ASSIGNMENT)
ReassignmentInProgressError = _error_class("ReassignmentInProgressError", ErrorCode.REASSIGNMENT_IN_PROGRESS)
NoReassignmentInProgressError = _error_class("NoReassignmentInProgressError", ErrorCode.NO_REASSIGNMENT_IN_PROGRESS)
PreferredLeaderNotAvailableError = _error_class("PreferredLeaderNotAvailableError",
                                                ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE)
EligibleLeadersNotAvailableError = _error_class("EligibleLeadersNotAvailableError",
                                                ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)
ElectionNotNeededError = _error_class("ElectionNotNeededError", ErrorCode.ELECTION_NOT_NEEDED)
InconsistentClusterIdError = _error_class("InconsistentClusterIdError", ErrorCode.INCONSISTENT_CLUSTER_ID)
StaleBrokerEpochError = _error_class("StaleBrokerEpochError", ErrorCode.STALE_BROKER_EPOCH)
OffsetNotAvailableError = _error_class("OffsetNotAvailableError", ErrorCode.OFFSET_NOT_AVAILABLE)
TopicAuthorizationFailedError = _error_class("TopicAuthorizationFailedError", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
GroupAuthorizationFailedError = _error_class("GroupAuthorizationFailedError", ErrorCode.GROUP_AUTHORIZATION_FAILED)
ClusterAuthorizationFailedError = _error_class("ClusterAuthorizationFailedError",
                                               ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
TransactionalIdAuthorizationFailedError = _error_class("TransactionalIdAuthorizationFailedError",
                                                       ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
SaslAuthenticationError = _error_class("SaslAuthenticationError", ErrorCode.SASL_AUTHENTICATION_FAILED)
SecurityDisabledError = _error_class("SecurityDisabledError", ErrorCode.SECURITY_DISABLED)
UnknownServerError = _error_class("UnknownServerError", ErrorCode.UNKNOWN_SERVER_ERROR)

_BY_CODE: dict[ErrorCode, type[EosError]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, EosError) and _cls is not EosError:
        _BY_CODE.setdefault(_cls.code, _cls)


def error_for(code: int, message: str = "") -> EosError:
    """The exception for a wire error code (a plain EosError for codes without a class)."""
    code = ErrorCode(code)
    cls = _BY_CODE.get(code)
    if cls is None:
        return EosError(message or code.name, code)
    return cls(message or code.name)


class InvariantError(Exception):
    """An internal invariant broke: a bug, never bad input. Raised instead of `assert`
    so that the check survives `python -O`."""


def error_code_and_message(exc: BaseException) -> tuple[int, str]:
    """(error code, message) to answer for an exception raised while serving one partition
    or topic: an EosError's own, else UNKNOWN_SERVER_ERROR naming the exception."""
    if isinstance(exc, EosError):
        return int(exc.code), str(exc)
    return int(ErrorCode.UNKNOWN_SERVER_ERROR), f"unexpected {type(exc).__name__}: {exc}"


def raise_if_error(answer, what: str) -> None:
    """An RPC answer's error (its error_code and error_message fields) as the eos error,
    `what` first; nothing when its code is NONE."""
    if answer.error_code != ErrorCode.NONE:
        raise error_for(answer.error_code, f"{what}: {answer.error_message or ErrorCode(answer.error_code).name}")
