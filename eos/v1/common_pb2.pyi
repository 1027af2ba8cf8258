from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[ErrorCode]
    UNKNOWN_SERVER_ERROR: _ClassVar[ErrorCode]
    OFFSET_OUT_OF_RANGE: _ClassVar[ErrorCode]
    CORRUPT_MESSAGE: _ClassVar[ErrorCode]
    UNKNOWN_TOPIC_OR_PARTITION: _ClassVar[ErrorCode]
    INVALID_FETCH_SIZE: _ClassVar[ErrorCode]
    LEADER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    NOT_LEADER_OR_FOLLOWER: _ClassVar[ErrorCode]
    REQUEST_TIMED_OUT: _ClassVar[ErrorCode]
    BROKER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    REPLICA_NOT_AVAILABLE: _ClassVar[ErrorCode]
    MESSAGE_TOO_LARGE: _ClassVar[ErrorCode]
    OFFSET_METADATA_TOO_LARGE: _ClassVar[ErrorCode]
    NETWORK_EXCEPTION: _ClassVar[ErrorCode]
    COORDINATOR_LOAD_IN_PROGRESS: _ClassVar[ErrorCode]
    COORDINATOR_NOT_AVAILABLE: _ClassVar[ErrorCode]
    NOT_COORDINATOR: _ClassVar[ErrorCode]
    INVALID_TOPIC_EXCEPTION: _ClassVar[ErrorCode]
    RECORD_LIST_TOO_LARGE: _ClassVar[ErrorCode]
    NOT_ENOUGH_REPLICAS: _ClassVar[ErrorCode]
    NOT_ENOUGH_REPLICAS_AFTER_APPEND: _ClassVar[ErrorCode]
    INVALID_REQUIRED_ACKS: _ClassVar[ErrorCode]
    ILLEGAL_GENERATION: _ClassVar[ErrorCode]
    INCONSISTENT_GROUP_PROTOCOL: _ClassVar[ErrorCode]
    INVALID_GROUP_ID: _ClassVar[ErrorCode]
    UNKNOWN_MEMBER_ID: _ClassVar[ErrorCode]
    INVALID_SESSION_TIMEOUT: _ClassVar[ErrorCode]
    REBALANCE_IN_PROGRESS: _ClassVar[ErrorCode]
    INVALID_COMMIT_OFFSET_SIZE: _ClassVar[ErrorCode]
    INVALID_TIMESTAMP: _ClassVar[ErrorCode]
    UNSUPPORTED_VERSION: _ClassVar[ErrorCode]
    TOPIC_ALREADY_EXISTS: _ClassVar[ErrorCode]
    INVALID_PARTITIONS: _ClassVar[ErrorCode]
    INVALID_REPLICATION_FACTOR: _ClassVar[ErrorCode]
    INVALID_CONFIG: _ClassVar[ErrorCode]
    INVALID_REQUEST: _ClassVar[ErrorCode]
    UNSUPPORTED_FOR_MESSAGE_FORMAT: _ClassVar[ErrorCode]
    OUT_OF_ORDER_SEQUENCE_NUMBER: _ClassVar[ErrorCode]
    DUPLICATE_SEQUENCE_NUMBER: _ClassVar[ErrorCode]
    INVALID_PRODUCER_EPOCH: _ClassVar[ErrorCode]
    INVALID_TXN_STATE: _ClassVar[ErrorCode]
    INVALID_PRODUCER_ID_MAPPING: _ClassVar[ErrorCode]
    INVALID_TRANSACTION_TIMEOUT: _ClassVar[ErrorCode]
    CONCURRENT_TRANSACTIONS: _ClassVar[ErrorCode]
    TRANSACTION_COORDINATOR_FENCED: _ClassVar[ErrorCode]
    KAFKA_STORAGE_ERROR: _ClassVar[ErrorCode]
    UNKNOWN_PRODUCER_ID: _ClassVar[ErrorCode]
    NON_EMPTY_GROUP: _ClassVar[ErrorCode]
    GROUP_ID_NOT_FOUND: _ClassVar[ErrorCode]
    MEMBER_ID_REQUIRED: _ClassVar[ErrorCode]
    GROUP_MAX_SIZE_REACHED: _ClassVar[ErrorCode]
    FENCED_INSTANCE_ID: _ClassVar[ErrorCode]
    INVALID_RECORD: _ClassVar[ErrorCode]
    UNSTABLE_OFFSET_COMMIT: _ClassVar[ErrorCode]
    PRODUCER_FENCED: _ClassVar[ErrorCode]
    TRANSACTIONAL_ID_NOT_FOUND: _ClassVar[ErrorCode]
    TRANSACTION_ABORTABLE: _ClassVar[ErrorCode]

class IsolationLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_UNCOMMITTED: _ClassVar[IsolationLevel]
    READ_COMMITTED: _ClassVar[IsolationLevel]
NONE: ErrorCode
UNKNOWN_SERVER_ERROR: ErrorCode
OFFSET_OUT_OF_RANGE: ErrorCode
CORRUPT_MESSAGE: ErrorCode
UNKNOWN_TOPIC_OR_PARTITION: ErrorCode
INVALID_FETCH_SIZE: ErrorCode
LEADER_NOT_AVAILABLE: ErrorCode
NOT_LEADER_OR_FOLLOWER: ErrorCode
REQUEST_TIMED_OUT: ErrorCode
BROKER_NOT_AVAILABLE: ErrorCode
REPLICA_NOT_AVAILABLE: ErrorCode
MESSAGE_TOO_LARGE: ErrorCode
OFFSET_METADATA_TOO_LARGE: ErrorCode
NETWORK_EXCEPTION: ErrorCode
COORDINATOR_LOAD_IN_PROGRESS: ErrorCode
COORDINATOR_NOT_AVAILABLE: ErrorCode
NOT_COORDINATOR: ErrorCode
INVALID_TOPIC_EXCEPTION: ErrorCode
RECORD_LIST_TOO_LARGE: ErrorCode
NOT_ENOUGH_REPLICAS: ErrorCode
NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode
INVALID_REQUIRED_ACKS: ErrorCode
ILLEGAL_GENERATION: ErrorCode
INCONSISTENT_GROUP_PROTOCOL: ErrorCode
INVALID_GROUP_ID: ErrorCode
UNKNOWN_MEMBER_ID: ErrorCode
INVALID_SESSION_TIMEOUT: ErrorCode
REBALANCE_IN_PROGRESS: ErrorCode
INVALID_COMMIT_OFFSET_SIZE: ErrorCode
INVALID_TIMESTAMP: ErrorCode
UNSUPPORTED_VERSION: ErrorCode
TOPIC_ALREADY_EXISTS: ErrorCode
INVALID_PARTITIONS: ErrorCode
INVALID_REPLICATION_FACTOR: ErrorCode
INVALID_CONFIG: ErrorCode
INVALID_REQUEST: ErrorCode
UNSUPPORTED_FOR_MESSAGE_FORMAT: ErrorCode
OUT_OF_ORDER_SEQUENCE_NUMBER: ErrorCode
DUPLICATE_SEQUENCE_NUMBER: ErrorCode
INVALID_PRODUCER_EPOCH: ErrorCode
INVALID_TXN_STATE: ErrorCode
INVALID_PRODUCER_ID_MAPPING: ErrorCode
INVALID_TRANSACTION_TIMEOUT: ErrorCode
CONCURRENT_TRANSACTIONS: ErrorCode
TRANSACTION_COORDINATOR_FENCED: ErrorCode
KAFKA_STORAGE_ERROR: ErrorCode
UNKNOWN_PRODUCER_ID: ErrorCode
NON_EMPTY_GROUP: ErrorCode
GROUP_ID_NOT_FOUND: ErrorCode
MEMBER_ID_REQUIRED: ErrorCode
GROUP_MAX_SIZE_REACHED: ErrorCode
FENCED_INSTANCE_ID: ErrorCode
INVALID_RECORD: ErrorCode
UNSTABLE_OFFSET_COMMIT: ErrorCode
PRODUCER_FENCED: ErrorCode
TRANSACTIONAL_ID_NOT_FOUND: ErrorCode
TRANSACTION_ABORTABLE: ErrorCode
READ_UNCOMMITTED: IsolationLevel
READ_COMMITTED: IsolationLevel

class TopicPartition(_message.Message):
    __slots__ = ("topic", "partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...
