"""The storage engine: partitions as directories of segments in Kafka's on-disk format.

Plain files and bytes only: nothing here imports grpc, protobuf, asyncio or pyspark.
"""
from broker.storage.checkpoint import OffsetCheckpointFile
from broker.storage.index import OffsetIndex, TimeIndex
from broker.storage.log import AppendOrigin, FetchData, Log, LogAppendInfo, parse_partition_dir_name, partition_dir_name
from broker.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from broker.storage.producer_state import CompletedTxn, ProducerStateEntry
from broker.storage.segment import LogSegment
from broker.storage.txn_index import AbortedTxn, TransactionIndex

__all__ = [
    "AbortedTxn", "AppendOrigin", "CLEAN_SHUTDOWN_FILE", "CompletedTxn", "FetchData", "Log", "LogAppendInfo",
    "LogManager", "LogSegment", "OffsetCheckpointFile", "OffsetIndex", "ProducerStateEntry", "TimeIndex",
    "TransactionIndex", "parse_partition_dir_name", "partition_dir_name",
]
