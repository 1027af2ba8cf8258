from eos.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProduceRequest(_message.Message):
    __slots__ = ("transactional_id", "acks", "timeout_ms", "partitions", "correlation_id", "add_partitions_to_txn")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    ADD_PARTITIONS_TO_TXN_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    acks: int
    timeout_ms: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionRecords]
    correlation_id: int
    add_partitions_to_txn: bool
    def __init__(self, transactional_id: _Optional[str] = ..., acks: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionRecords, _Mapping]]] = ..., correlation_id: _Optional[int] = ..., add_partitions_to_txn: _Optional[bool] = ...) -> None: ...

class PartitionRecords(_message.Message):
    __slots__ = ("topic", "partition", "records")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    records: bytes
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., records: _Optional[bytes] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("partitions", "throttle_time_ms", "correlation_id")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionProduceResult]
    throttle_time_ms: int
    correlation_id: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionProduceResult, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ..., correlation_id: _Optional[int] = ...) -> None: ...

class PartitionProduceResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "base_offset", "log_append_time_ms", "log_start_offset", "current_leader")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_APPEND_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    current_leader: LeaderIdAndEpoch
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., base_offset: _Optional[int] = ..., log_append_time_ms: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., current_leader: _Optional[_Union[LeaderIdAndEpoch, _Mapping]] = ...) -> None: ...

class LeaderIdAndEpoch(_message.Message):
    __slots__ = ("leader_id", "leader_epoch")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    leader_epoch: int
    def __init__(self, leader_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("max_wait_ms", "min_bytes", "max_bytes", "isolation_level", "partitions", "is_replica", "replica_id", "replica_broker_epoch", "session_id", "session_epoch", "forgotten")
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    IS_REPLICA_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: _common_pb2.IsolationLevel
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartition]
    is_replica: bool
    replica_id: int
    replica_broker_epoch: int
    session_id: int
    session_epoch: int
    forgotten: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    def __init__(self, max_wait_ms: _Optional[int] = ..., min_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., isolation_level: _Optional[_Union[_common_pb2.IsolationLevel, str]] = ..., partitions: _Optional[_Iterable[_Union[FetchPartition, _Mapping]]] = ..., is_replica: _Optional[bool] = ..., replica_id: _Optional[int] = ..., replica_broker_epoch: _Optional[int] = ..., session_id: _Optional[int] = ..., session_epoch: _Optional[int] = ..., forgotten: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ...) -> None: ...

class FetchPartition(_message.Message):
    __slots__ = ("topic", "partition", "fetch_offset", "partition_max_bytes", "has_leader_epoch", "current_leader_epoch", "log_start_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PARTITION_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    HAS_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    has_leader_epoch: bool
    current_leader_epoch: int
    log_start_offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., partition_max_bytes: _Optional[int] = ..., has_leader_epoch: _Optional[bool] = ..., current_leader_epoch: _Optional[int] = ..., log_start_offset: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("partitions", "throttle_time_ms", "error_code", "error_message", "session_id")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[FetchedPartition]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    session_id: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[FetchedPartition, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., session_id: _Optional[int] = ...) -> None: ...

class FetchedPartition(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "high_watermark", "last_stable_offset", "log_start_offset", "aborted_transactions", "records", "current_leader")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAST_STABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ABORTED_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: _containers.RepeatedCompositeFieldContainer[AbortedTransaction]
    records: bytes
    current_leader: LeaderIdAndEpoch
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., high_watermark: _Optional[int] = ..., last_stable_offset: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., aborted_transactions: _Optional[_Iterable[_Union[AbortedTransaction, _Mapping]]] = ..., records: _Optional[bytes] = ..., current_leader: _Optional[_Union[LeaderIdAndEpoch, _Mapping]] = ...) -> None: ...

class AbortedTransaction(_message.Message):
    __slots__ = ("producer_id", "first_offset")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    first_offset: int
    def __init__(self, producer_id: _Optional[int] = ..., first_offset: _Optional[int] = ...) -> None: ...

class ListOffsetsRequest(_message.Message):
    __slots__ = ("isolation_level", "partitions")
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    isolation_level: _common_pb2.IsolationLevel
    partitions: _containers.RepeatedCompositeFieldContainer[ListOffsetsPartition]
    def __init__(self, isolation_level: _Optional[_Union[_common_pb2.IsolationLevel, str]] = ..., partitions: _Optional[_Iterable[_Union[ListOffsetsPartition, _Mapping]]] = ...) -> None: ...

class ListOffsetsPartition(_message.Message):
    __slots__ = ("topic", "partition", "timestamp")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    timestamp: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...

class ListOffsetsResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[ListedOffset]
    def __init__(self, partitions: _Optional[_Iterable[_Union[ListedOffset, _Mapping]]] = ...) -> None: ...

class ListedOffset(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "timestamp", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    timestamp: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., timestamp: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class MetadataRequest(_message.Message):
    __slots__ = ("topics", "include_internal", "include_cluster_authorized_operations")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INTERNAL_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CLUSTER_AUTHORIZED_OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    include_internal: bool
    include_cluster_authorized_operations: bool
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., include_internal: _Optional[bool] = ..., include_cluster_authorized_operations: _Optional[bool] = ...) -> None: ...

class MetadataResponse(_message.Message):
    __slots__ = ("brokers", "controller_id", "topics", "cluster_id", "cluster_authorized_operations")
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_AUTHORIZED_OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerNode]
    controller_id: int
    topics: _containers.RepeatedCompositeFieldContainer[TopicMetadata]
    cluster_id: str
    cluster_authorized_operations: int
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerNode, _Mapping]]] = ..., controller_id: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[TopicMetadata, _Mapping]]] = ..., cluster_id: _Optional[str] = ..., cluster_authorized_operations: _Optional[int] = ...) -> None: ...

class BrokerNode(_message.Message):
    __slots__ = ("node_id", "host", "port", "rack", "socket_port")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    SOCKET_PORT_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    host: str
    port: int
    rack: str
    socket_port: int
    def __init__(self, node_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ..., socket_port: _Optional[int] = ...) -> None: ...

class TopicMetadata(_message.Message):
    __slots__ = ("name", "error_code", "error_message", "is_internal", "partitions", "configs")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IS_INTERNAL_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    is_internal: bool
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionMetadata]
    configs: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., is_internal: _Optional[bool] = ..., partitions: _Optional[_Iterable[_Union[PartitionMetadata, _Mapping]]] = ..., configs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PartitionMetadata(_message.Message):
    __slots__ = ("partition", "error_code", "leader_id", "leader_epoch", "replica_ids", "isr_ids", "offline_replica_ids")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    ISR_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: _common_pb2.ErrorCode
    leader_id: int
    leader_epoch: int
    replica_ids: _containers.RepeatedScalarFieldContainer[int]
    isr_ids: _containers.RepeatedScalarFieldContainer[int]
    offline_replica_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., leader_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., replica_ids: _Optional[_Iterable[int]] = ..., isr_ids: _Optional[_Iterable[int]] = ..., offline_replica_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CreateTopicsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[NewTopic]
    timeout_ms: int
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[NewTopic, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class NewTopic(_message.Message):
    __slots__ = ("name", "num_partitions", "replication_factor", "configs", "assignments")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_partitions: int
    replication_factor: int
    configs: _containers.ScalarMap[str, str]
    assignments: _containers.RepeatedCompositeFieldContainer[ReplicaAssignment]
    def __init__(self, name: _Optional[str] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ..., configs: _Optional[_Mapping[str, str]] = ..., assignments: _Optional[_Iterable[_Union[ReplicaAssignment, _Mapping]]] = ...) -> None: ...

class ReplicaAssignment(_message.Message):
    __slots__ = ("partition", "broker_ids")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BROKER_IDS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    broker_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partition: _Optional[int] = ..., broker_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CreateTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicResult]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ...) -> None: ...

class TopicResult(_message.Message):
    __slots__ = ("name", "error_code", "error_message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DeleteTopicsRequest(_message.Message):
    __slots__ = ("names", "timeout_ms")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    def __init__(self, names: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class DeleteTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicResult]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ...) -> None: ...

class CreatePartitionsRequest(_message.Message):
    __slots__ = ("topics", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[NewPartitions]
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[NewPartitions, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class NewPartitions(_message.Message):
    __slots__ = ("name", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class CreatePartitionsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicResult]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ...) -> None: ...

class WriteTxnMarkersRequest(_message.Message):
    __slots__ = ("markers",)
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    markers: _containers.RepeatedCompositeFieldContainer[TxnMarker]
    def __init__(self, markers: _Optional[_Iterable[_Union[TxnMarker, _Mapping]]] = ...) -> None: ...

class TxnMarker(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "committed", "coordinator_epoch", "partitions")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., committed: _Optional[bool] = ..., coordinator_epoch: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ...) -> None: ...

class WriteTxnMarkersResponse(_message.Message):
    __slots__ = ("markers",)
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    markers: _containers.RepeatedCompositeFieldContainer[TxnMarkerResult]
    def __init__(self, markers: _Optional[_Iterable[_Union[TxnMarkerResult, _Mapping]]] = ...) -> None: ...

class TxnMarkerResult(_message.Message):
    __slots__ = ("producer_id", "partitions")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionError]
    def __init__(self, producer_id: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionError, _Mapping]]] = ...) -> None: ...

class PartitionError(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DescribeProducersRequest(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicPartition]
    def __init__(self, partitions: _Optional[_Iterable[_Union[_common_pb2.TopicPartition, _Mapping]]] = ...) -> None: ...

class DescribeProducersResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionProducers]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionProducers, _Mapping]]] = ...) -> None: ...

class PartitionProducers(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "producers")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    producers: _containers.RepeatedCompositeFieldContainer[ProducerStateInfo]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., producers: _Optional[_Iterable[_Union[ProducerStateInfo, _Mapping]]] = ...) -> None: ...

class ProducerStateInfo(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "last_sequence", "last_timestamp_ms", "coordinator_epoch", "current_txn_start_offset")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TXN_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    current_txn_start_offset: int
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., last_sequence: _Optional[int] = ..., last_timestamp_ms: _Optional[int] = ..., coordinator_epoch: _Optional[int] = ..., current_txn_start_offset: _Optional[int] = ...) -> None: ...

class DescribeLogDirsRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[DescribableLogDirTopic]
    def __init__(self, topics: _Optional[_Iterable[_Union[DescribableLogDirTopic, _Mapping]]] = ...) -> None: ...

class DescribableLogDirTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class DescribeLogDirsResponse(_message.Message):
    __slots__ = ("throttle_time_ms", "error_code", "error_message", "results")
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    results: _containers.RepeatedCompositeFieldContainer[LogDirDescription]
    def __init__(self, throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., results: _Optional[_Iterable[_Union[LogDirDescription, _Mapping]]] = ...) -> None: ...

class LogDirDescription(_message.Message):
    __slots__ = ("error_code", "error_message", "log_dir", "topics", "total_bytes", "usable_bytes", "storage_error_count", "last_storage_error")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOG_DIR_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    USABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_ERROR_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_STORAGE_ERROR_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    log_dir: str
    topics: _containers.RepeatedCompositeFieldContainer[LogDirTopic]
    total_bytes: int
    usable_bytes: int
    storage_error_count: int
    last_storage_error: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., log_dir: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[LogDirTopic, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., usable_bytes: _Optional[int] = ..., storage_error_count: _Optional[int] = ..., last_storage_error: _Optional[str] = ...) -> None: ...

class LogDirTopic(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[LogDirPartition]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[LogDirPartition, _Mapping]]] = ...) -> None: ...

class LogDirPartition(_message.Message):
    __slots__ = ("partition", "size_bytes", "offset_lag", "is_future")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_LAG_FIELD_NUMBER: _ClassVar[int]
    IS_FUTURE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    size_bytes: int
    offset_lag: int
    is_future: bool
    def __init__(self, partition: _Optional[int] = ..., size_bytes: _Optional[int] = ..., offset_lag: _Optional[int] = ..., is_future: _Optional[bool] = ...) -> None: ...

class AclBinding(_message.Message):
    __slots__ = ("resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[int] = ..., principal: _Optional[str] = ..., host: _Optional[str] = ..., operation: _Optional[int] = ..., permission: _Optional[int] = ...) -> None: ...

class AclBindingFilter(_message.Message):
    __slots__ = ("resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[int] = ..., principal: _Optional[str] = ..., host: _Optional[str] = ..., operation: _Optional[int] = ..., permission: _Optional[int] = ...) -> None: ...

class CreateAclsRequest(_message.Message):
    __slots__ = ("creations",)
    CREATIONS_FIELD_NUMBER: _ClassVar[int]
    creations: _containers.RepeatedCompositeFieldContainer[AclBinding]
    def __init__(self, creations: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ...) -> None: ...

class AclCreationResult(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class CreateAclsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AclCreationResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AclCreationResult, _Mapping]]] = ...) -> None: ...

class DescribeAclsRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: AclBindingFilter
    def __init__(self, filter: _Optional[_Union[AclBindingFilter, _Mapping]] = ...) -> None: ...

class DescribeAclsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "acls")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACLS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    acls: _containers.RepeatedCompositeFieldContainer[AclBinding]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., acls: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ...) -> None: ...

class DeleteAclsRequest(_message.Message):
    __slots__ = ("filters",)
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    filters: _containers.RepeatedCompositeFieldContainer[AclBindingFilter]
    def __init__(self, filters: _Optional[_Iterable[_Union[AclBindingFilter, _Mapping]]] = ...) -> None: ...

class DeleteAclsFilterResult(_message.Message):
    __slots__ = ("error_code", "error_message", "matching_acls")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MATCHING_ACLS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    matching_acls: _containers.RepeatedCompositeFieldContainer[AclBinding]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., matching_acls: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ...) -> None: ...

class DeleteAclsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DeleteAclsFilterResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DeleteAclsFilterResult, _Mapping]]] = ...) -> None: ...

class ConfigResource(_message.Message):
    __slots__ = ("resource_type", "resource_name", "config_names")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_NAMES_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    config_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., config_names: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeConfigsRequest(_message.Message):
    __slots__ = ("resources",)
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[ConfigResource]
    def __init__(self, resources: _Optional[_Iterable[_Union[ConfigResource, _Mapping]]] = ...) -> None: ...

class DescribeConfigsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DescribeConfigsResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DescribeConfigsResult, _Mapping]]] = ...) -> None: ...

class DescribeConfigsResult(_message.Message):
    __slots__ = ("resource_type", "resource_name", "error_code", "error_message", "configs")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    configs: _containers.RepeatedCompositeFieldContainer[ConfigEntry]
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., configs: _Optional[_Iterable[_Union[ConfigEntry, _Mapping]]] = ...) -> None: ...

class ConfigEntry(_message.Message):
    __slots__ = ("name", "value", "read_only", "config_source", "is_sensitive")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    CONFIG_SOURCE_FIELD_NUMBER: _ClassVar[int]
    IS_SENSITIVE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    read_only: bool
    config_source: int
    is_sensitive: bool
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., read_only: _Optional[bool] = ..., config_source: _Optional[int] = ..., is_sensitive: _Optional[bool] = ...) -> None: ...

class IncrementalAlterConfigsRequest(_message.Message):
    __slots__ = ("resources", "validate_only")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[AlterConfigsResource]
    validate_only: bool
    def __init__(self, resources: _Optional[_Iterable[_Union[AlterConfigsResource, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class AlterConfigsResource(_message.Message):
    __slots__ = ("resource_type", "resource_name", "configs")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    configs: _containers.RepeatedCompositeFieldContainer[AlterableConfig]
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., configs: _Optional[_Iterable[_Union[AlterableConfig, _Mapping]]] = ...) -> None: ...

class AlterableConfig(_message.Message):
    __slots__ = ("name", "config_operation", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_OPERATION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    config_operation: int
    value: str
    def __init__(self, name: _Optional[str] = ..., config_operation: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...

class IncrementalAlterConfigsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AlterConfigsResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AlterConfigsResult, _Mapping]]] = ...) -> None: ...

class AlterConfigsResult(_message.Message):
    __slots__ = ("resource_type", "resource_name", "error_code", "error_message")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DeleteRecordsRequest(_message.Message):
    __slots__ = ("partitions", "timeout_ms")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[DeleteRecordsPartition]
    timeout_ms: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[DeleteRecordsPartition, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class DeleteRecordsPartition(_message.Message):
    __slots__ = ("topic", "partition", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class DeleteRecordsResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[DeleteRecordsResult]
    def __init__(self, partitions: _Optional[_Iterable[_Union[DeleteRecordsResult, _Mapping]]] = ...) -> None: ...

class DeleteRecordsResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "low_watermark")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    low_watermark: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., low_watermark: _Optional[int] = ...) -> None: ...
