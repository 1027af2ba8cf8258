"""The group coordinator's pure cores: membership (`state`), committed offsets (`offsets`) and
the `__consumer_offsets` record codec (`records`). No I/O, no threads: a service shell drives
them with requests and the time, and carries out the writes they ask for."""
from broker.group.offsets import OffsetStore, OffsetWrite
from broker.group.records import OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITIONS, partition_for_group
from broker.group.state import GroupCoordinatorCore, GroupState, GroupWrite, Outcome

__all__ = ["GroupCoordinatorCore", "GroupState", "GroupWrite", "Outcome", "OffsetStore", "OffsetWrite",
           "OFFSETS_TOPIC", "OFFSETS_TOPIC_PARTITIONS", "partition_for_group"]
