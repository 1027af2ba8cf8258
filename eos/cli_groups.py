"""`eos groups`: consumer groups (after kafka-consumer-groups.sh).

    eos groups list [--state [STATE]]
    eos groups describe GROUP [--members | --state] [--isolation read_committed]
    eos groups offsets GROUP
    eos groups delete GROUP [GROUP...]
    eos groups reset-offsets GROUP (--topic T[:P,P...] ... | --all-topics)
                              (--to-earliest | --to-latest | --to-offset N | --shift-by N | --to-datetime T)
                              [--dry-run | --execute]

`describe` prints each partition's committed offset, its end (the last stable offset under
read_committed, the default: what an exactly-once pipeline's consumers can reach) and the lag.
`delete` and `reset-offsets` work on a group without active members, as Kafka's tool does:
`delete` removes the group and its committed offsets; `reset-offsets` computes the new
offsets and, with --execute only, commits them (without it the plan is printed and nothing
changes, as Kafka's tool does without --execute). New offsets are kept within each partition's
[log start, high watermark], as Kafka's tool clamps them (and says so); --shift-by needs a
committed offset, and a --to-datetime without a zone is local time, as in Kafka's tool.
"""
from __future__ import annotations

import datetime
import sys

from eos.errors import EosError, ErrorCode

RESET_SCOPE_HELP = "reset-offsets: a topic, or TOPIC:P,P for some partitions (repeatable)"
INACTIVE_STATES = ("Empty", "Dead")
NO_EXECUTE_WARNING = ("WARN: No action will be performed as the --execute option is missing. Add --execute "
                      "to reset the offsets, or --dry-run to print the plan without this warning.")


def add_commands(client_command) -> None:
    """Register `eos groups` on the `eos` parser."""
    groups = client_command("groups", help="list, describe, delete consumer groups; their offsets, lag and resets")
    groups.add_argument("action", choices=["list", "describe", "offsets", "delete", "reset-offsets"])
    groups.add_argument("groups", nargs="*", metavar="GROUP", help="the group (delete: one or more)")
    groups.add_argument("--isolation", default="read_committed", choices=["read_uncommitted", "read_committed"],
                        help="the consumers' isolation level: lag is measured against the last stable offset "
                             "under read_committed, the high watermark under read_uncommitted (default: "
                             "read_committed, the isolation of exactly-once pipelines)")
    groups.add_argument("--state", action="append", nargs="?", const="", metavar="STATE",
                        help="list: show states, only groups in STATE if given (repeatable); "
                             "describe: the group's state, protocol and generation")
    groups.add_argument("--members", action="store_true", help="describe: the members and their assignments")
    groups.add_argument("--topic", action="append", metavar="TOPIC[:P,P]", help=RESET_SCOPE_HELP)
    groups.add_argument("--all-topics", action="store_true", help="reset-offsets: every topic the group has offsets of")
    target = groups.add_mutually_exclusive_group()
    target.add_argument("--to-earliest", action="store_true", help="reset-offsets: to the log start offset")
    target.add_argument("--to-latest", action="store_true", help="reset-offsets: to the high watermark")
    target.add_argument("--to-offset", type=int, metavar="N", help="reset-offsets: to offset N")
    target.add_argument("--shift-by", type=int, metavar="N",
                        help="reset-offsets: the committed offset plus N (negative: back)")
    target.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss",
                        help="reset-offsets: the first offset at or after this time (local time unless it "
                             "says +HH:MM)")
    mode = groups.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="reset-offsets: print the plan only")
    mode.add_argument("--execute", action="store_true", help="reset-offsets: commit the new offsets")
    groups.set_defaults(handler=cmd_groups)


def cmd_groups(args) -> int:
    import eos
    from eos.cli import client_config
    with eos.Admin(bootstrap=args.bootstrap_server, config=client_config(args)) as admin:
        if args.action == "list":
            return _list(admin, args)
        if not args.groups:
            print(f"error: eos groups {args.action} needs a GROUP", file=sys.stderr)
            return 2
        if args.action == "delete":
            return _delete(admin, args.groups)
        if len(args.groups) > 1:
            print(f"error: eos groups {args.action} takes one GROUP", file=sys.stderr)
            return 2
        group = args.groups[0]
        if args.action == "offsets":
            from eos.cli import _print_table
            offsets = admin.list_group_offsets(group)
            _print_table(["TOPIC", "PARTITION", "OFFSET"], [[tp.topic, tp.partition, o] for tp, o in offsets.items()])
            return 0
        if args.action == "reset-offsets":
            return _reset_offsets(admin, group, args)
        return _describe(admin, group, args)


def _list(admin, args) -> int:
    from eos.cli import _print_table
    groups = admin.list_groups(states=[state for state in args.state or [] if state])
    if args.state is not None:
        _print_table(["GROUP", "STATE"], [[g["group_id"], g["state"]] for g in groups])
    else:
        for g in groups:
            print(g["group_id"])
    return 0


def _group_state(admin, group: str) -> tuple[str | None, dict | None]:
    """(state, description) of the group; (None, None) when it does not exist as a group."""
    try:
        description = admin.describe_group(group)
    except EosError as exc:
        if exc.code != ErrorCode.GROUP_ID_NOT_FOUND:
            raise
        return None, None
    return description["state"], description


def _describe(admin, group: str, args) -> int:
    from eos.cli import _print_table
    if args.members or args.state is not None:
        description = admin.describe_group(group)
        if not args.members:
            _print_table(["GROUP", "ASSIGNMENT-STRATEGY", "STATE", "GENERATION", "#MEMBERS"],
                         [[group, description["protocol"], description["state"], description["generation"],
                           len(description["members"])]])
        else:
            _print_table(["CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"],
                         [[m["member_id"], m["group_instance_id"], m["host"], m["client_id"], len(m["assignment"]),
                           ",".join(f"{tp.topic}-{tp.partition}" for tp in m["assignment"])]
                          for m in description["members"]])
        return 0
    # one DescribeGroups: the state printed and the members in the rows are of one moment
    state, description = _group_state(admin, group)
    rows = admin.group_lag(group, isolation_level=args.isolation, description=description)
    # Kafka's tool: members mid-rebalance hold no partitions, and the group is not idle
    if state in ("PreparingRebalance", "CompletingRebalance"):
        print(f"Warning: Consumer group '{group}' is rebalancing.")
    elif state in (None, *INACTIVE_STATES):
        print(f"Consumer group '{group}' has no active members.")
    against = "the last stable offset" if args.isolation == "read_committed" else "the high watermark"
    print(f"Lag of consumer group '{group}' against {against} ({args.isolation}):")
    _print_table(["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
                  "CLIENT-ID"],
                 [[r["topic"], r["partition"], r["current_offset"], r["log_end_offset"], r["lag"], r["member_id"],
                   r["host"], r["client_id"]] for r in rows])
    return 0


def _delete(admin, groups: list[str]) -> int:
    results = admin.delete_groups(groups)
    failed = {group: error for group, error in results.items() if error is not None}
    deleted = [group for group in results if group not in failed]
    if deleted:
        print(f"Deletion of requested consumer groups ({', '.join(repr(g) for g in deleted)}) was successful.")
    if failed:
        print("Error: Deletion of some consumer groups failed:", file=sys.stderr)
        for group, error in failed.items():
            print(f"* Group '{group}' could not be deleted due to: {error.code.name}: {error}", file=sys.stderr)
        return 1
    return 0


# ---- reset-offsets --------------------------------------------------------------------------

def _parse_datetime_ms(text: str) -> int:
    """Kafka's --to-datetime forms ('2026-11-29T10:00:00.000', a zone offset optional; without
    one the machine's local time, as Kafka's tool reads it) -> ms."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--to-datetime {text!r} is not YYYY-MM-DDTHH:mm:SS.sss (optionally +HH:MM)") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()     # a naive time is local
    return int(moment.timestamp() * 1000)


def _reset_scope(admin, group: str, args) -> list:
    """The partitions to reset: those named by --topic (all of a topic's without :P), or
    every partition the group has committed offsets of (--all-topics)."""
    from eos import TopicPartition
    if bool(args.topic) == bool(args.all_topics):
        raise ValueError("reset-offsets needs --topic TOPIC (repeatable) or --all-topics, one of the two")
    if args.all_topics:
        return sorted(admin.list_group_offsets(group))
    partitions = []
    for spec in args.topic:
        topic, _, numbers = spec.partition(":")
        if numbers:
            try:
                partitions += [TopicPartition(topic, int(p)) for p in numbers.split(",")]
            except ValueError:
                raise ValueError(f"--topic {spec!r}: partitions are numbers, as TOPIC:0,1,2") from None
        else:
            count = len(admin.describe_topic(topic)["partitions"])
            partitions += [TopicPartition(topic, p) for p in range(count)]
    return sorted(set(partitions))


def reset_plan(admin, group: str, partitions: list, args) -> dict:
    """{tp: new offset}, each within [log start, high watermark] (Kafka's tool clamps so)."""
    earliest = admin.list_offsets({tp: "earliest" for tp in partitions})
    latest = admin.list_offsets({tp: "latest" for tp in partitions})
    if args.to_earliest:
        wanted = dict(earliest)
    elif args.to_latest:
        wanted = dict(latest)
    elif args.to_offset is not None:
        wanted = {tp: args.to_offset for tp in partitions}
    elif args.shift_by is not None:
        committed = admin.list_group_offsets(group, partitions)
        missing = [tp for tp in partitions if tp not in committed]
        if missing:
            tp = missing[0]
            raise ValueError(f"Cannot shift offset for partition {tp.topic}-{tp.partition} since there is no "
                             f"current committed offset")
        wanted = {tp: committed[tp] + args.shift_by for tp in partitions}
    elif args.to_datetime is not None:
        at = admin.list_offsets({tp: _parse_datetime_ms(args.to_datetime) for tp in partitions})
        wanted = {tp: latest[tp] if offset < 0 else offset for tp, offset in at.items()}
    else:
        raise ValueError("reset-offsets needs one of --to-earliest, --to-latest, --to-offset, --shift-by, "
                         "--to-datetime")
    plan = {}
    for tp in partitions:
        # Kafka's tool keeps each offset within the log, and says so
        if wanted[tp] < earliest[tp]:
            print(f"New offset ({wanted[tp]}) is lower than earliest offset for topic partition "
                  f"{tp.topic}-{tp.partition}. Value will be set to {earliest[tp]}")
        elif wanted[tp] > latest[tp]:
            print(f"New offset ({wanted[tp]}) is higher than latest offset for topic partition "
                  f"{tp.topic}-{tp.partition}. Value will be set to {latest[tp]}")
        plan[tp] = min(max(wanted[tp], earliest[tp]), latest[tp])
    return plan


def _reset_offsets(admin, group: str, args) -> int:
    from eos.cli import _print_table
    state, _ = _group_state(admin, group)
    if state is not None and state not in INACTIVE_STATES:
        print(f"Error: Assignments can only be reset if the group '{group}' is inactive, but the current state "
              f"is {state}.", file=sys.stderr)
        return 1
    partitions = _reset_scope(admin, group, args)
    plan = reset_plan(admin, group, partitions, args)
    if not args.dry_run and not args.execute:
        print(NO_EXECUTE_WARNING)
    if args.execute:
        admin.alter_group_offsets(group, plan)
    _print_table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                 [[group, tp.topic, tp.partition, offset] for tp, offset in sorted(plan.items())])
    return 0
