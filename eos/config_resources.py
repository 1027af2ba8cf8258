"""Kafka's numbers for config resources, operations and sources (DescribeConfigs and
IncrementalAlterConfigs), shared by the Admin client and the broker (broker/topic_configs.py)."""
from __future__ import annotations

# ConfigResource.Type
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
# AlterConfigOp.OpType
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}
# DescribeConfigsResponse.ConfigSource (the ones eos answers)
SOURCE_DYNAMIC_TOPIC_CONFIG = 1
SOURCE_DYNAMIC_BROKER_CONFIG = 2
SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG = 3
SOURCE_STATIC_BROKER_CONFIG = 4
SOURCE_DEFAULT_CONFIG = 5
SOURCE_NAMES = {0: "UNKNOWN", SOURCE_DYNAMIC_TOPIC_CONFIG: "DYNAMIC_TOPIC_CONFIG",
                SOURCE_DYNAMIC_BROKER_CONFIG: "DYNAMIC_BROKER_CONFIG",
                SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG: "DYNAMIC_DEFAULT_BROKER_CONFIG", SOURCE_STATIC_BROKER_CONFIG: "STATIC_BROKER_CONFIG",
                SOURCE_DEFAULT_CONFIG: "DEFAULT_CONFIG"}
