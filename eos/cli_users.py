"""`eos users`: the SCRAM credentials of users (after kafka-configs.sh --entity-type users).

    eos users add NAME [--mechanism SCRAM-SHA-512] [--iterations 4096] [--password-file F]
    eos users list [NAME...]
    eos users remove NAME [--mechanism SCRAM-SHA-512]

Online, through a broker (--bootstrap-server, with the client settings of any command; with
an authorizer, adding and removing need ALTER on the cluster, listing DESCRIBE). With
--data-dir DIR instead, offline on a stopped broker's data directory, as kafka-storage's
--add-scram seeds the first user: on a broker whose only listener is SASL_SSL no one could
authenticate to add the first one.

The password is read from --password-file (its first line), else asked for on a terminal,
else read from the first line of stdin; never from a flag, which other users of the machine
could read in the process list. Only the salted credential is stored.
"""
from __future__ import annotations

import sys

MECHANISM_DEFAULT = "SCRAM-SHA-512"


def _password(args) -> str:
    if args.password_file:
        with open(args.password_file, encoding="utf-8") as file:
            password = file.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        import getpass
        password = getpass.getpass(f"password for {args.name}: ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise SystemExit("error: an empty password is refused")
    return password


def cmd_users(args) -> int:
    from eos.scram import ScramError, check_iterations, hash_name
    try:
        if args.action in ("add", "remove"):
            hash_name(args.mechanism)
        if args.action == "add":
            check_iterations(args.iterations)
    except ScramError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.data_dir:
        return _offline(args)
    import eos
    from eos.cli import client_config
    with eos.Admin(bootstrap=args.bootstrap_server, config=client_config(args)) as admin:
        if args.action == "add":
            admin.upsert_scram_credential(args.name, _password(args), mechanism=args.mechanism,
                                          iterations=args.iterations)
            print(f"Completed updating config for user {args.name}: {args.mechanism} (iterations {args.iterations}).")
        elif args.action == "remove":
            admin.delete_scram_credential(args.name, mechanism=args.mechanism)
            print(f"Completed removing the {args.mechanism} credential of user {args.name}.")
        else:
            _print_users(admin.describe_user_scram_credentials(args.names or None))
    return 0


def _offline(args) -> int:
    from pathlib import Path

    from broker.scram_users import ScramUsers
    from eos.scram import make_credential
    if args.action == "add":
        Path(args.data_dir).mkdir(parents=True, exist_ok=True)     # seeding a broker not yet started
    elif not Path(args.data_dir).is_dir():
        print(f"error: {args.data_dir} is not a directory", file=sys.stderr)
        return 1
    users = ScramUsers(args.data_dir)
    if args.action == "add":
        users.alter({(args.name, args.mechanism): make_credential(args.mechanism, _password(args), args.iterations)},
                    set())
        print(f"Added the {args.mechanism} credential of user {args.name} to {args.data_dir}.")
    elif args.action == "remove":
        try:
            users.alter({}, {(args.name, args.mechanism)})
        except KeyError as exc:
            print(f"error: {exc.args[0]}", file=sys.stderr)
            return 1
        print(f"Removed the {args.mechanism} credential of user {args.name} from {args.data_dir}.")
    else:
        known = users.describe()
        _print_users({name: known[name] for name in (args.names or sorted(known)) if name in known})
    return 0


def _print_users(found: dict[str, dict[str, int]]) -> None:
    if not found:
        print("No SCRAM users.")
    for user, mechanisms in sorted(found.items()):
        described = ", ".join(f"{m}=[iterations={i}]" for m, i in sorted(mechanisms.items()))
        print(f"SCRAM credential configs for user-principal '{user}' are {described}")


def add_commands(commands, client_command) -> None:
    """Register `eos users` on the `eos` parser."""
    users = client_command("users", help="add, list and remove SCRAM users (after kafka-configs --entity-type users)")
    users.add_argument("action", choices=["add", "list", "remove"])
    users.add_argument("names", nargs="*", metavar="NAME", help="add/remove: one user; list: these users (default all)")
    users.add_argument("--mechanism", default=MECHANISM_DEFAULT, help="SCRAM-SHA-256 or SCRAM-SHA-512 (default)")
    users.add_argument("--iterations", type=int, default=4096, help="add: PBKDF2 iterations, 4096 to 16384")
    users.add_argument("--password-file", metavar="FILE", help="add: the password's file (else a prompt or stdin)")
    users.add_argument("--data-dir", metavar="DIR", help="offline: a stopped broker's data directory")
    users.set_defaults(handler=_dispatch)


def _dispatch(args) -> int:
    if args.action in ("add", "remove"):
        if len(args.names) != 1:
            print(f"error: users {args.action} takes one user name", file=sys.stderr)
            return 2
        args.name = args.names[0]
    return cmd_users(args)
