"""Kafka's tool flags on the kstore command line.

Users of kafka-topics, kafka-consumer-groups and the console clients type their flags out of
habit. Before click parses the command line, each Kafka flag the command does not know itself
is either rewritten to its kstore form (``--topic T`` is the TOPIC argument, ``topics --create``
is ``topics create``) or refused with one line naming the kstore form.
"""

from __future__ import annotations

from typing import Any

from kstore.cli.common import UsageError

# Kafka's action flags, per command group: the kstore subcommand each one is.
_ACTIONS: dict[str, dict[str, str]] = {
    "topics": {
        "--create": "create",
        "--list": "list",
        "--describe": "describe",
        "--delete": "delete",
        "--alter": "alter",
    },
    "groups": {
        "--list": "list",
        "--describe": "describe",
        "--delete": "delete",
        "--reset-offsets": "reset-offsets",
        "--delete-offsets": "delete-offsets",
    },
}

_NO_BROKER = "a store is not a broker: name it with --store URL (or KSTORE_STORE)"

# Kafka flags with no kstore equivalent in any command: why, and what to do instead.
_REFUSED: dict[str, str] = {
    "--bootstrap-server": _NO_BROKER,
    "--bootstrap-servers": _NO_BROKER,
    "--broker-list": _NO_BROKER,
    "--zookeeper": _NO_BROKER,
    "--command-config": "kstore has no client config file: storage options go in "
    "--option KEY=VALUE or --config-file PATH",
    "--replication-factor": "kstore keeps no replicas: durability is the storage's "
    "(S3 or the local disk); drop the flag",
    "--replica-assignment": "kstore keeps no replicas: drop the flag",
    "--under-replicated-partitions": "kstore keeps no replicas: there are none",
    "--under-min-isr-partitions": "kstore keeps no replicas: there are none",
    "--unavailable-partitions": "kstore keeps no replicas: there are none",
    "--if-exists": "only 'kstore topics delete' takes --if-exists",
    "--all-groups": "name the groups (kstore groups list); only 'kstore groups describe' "
    "takes --all-groups",
    "--all-topics": "only 'kstore groups reset-offsets' takes --all-topics; elsewhere name "
    "the topics",
    "--from-beginning": "only 'kstore consume' takes --from-beginning",
    "--whitelist": "name the topic (one per command)",
    "--include": "name the topic (one per command)",
    "--members": "only 'kstore groups describe' takes --members",
    "--offsets": "'kstore groups describe' shows the offsets",
    "--state": "'kstore groups describe' and 'kstore groups list' show the state",
    "--timeout": "storage calls have their own deadline (--option timeout_ms=N); "
    "'kstore consume' takes --timeout-ms",
    "--producer.config": "kstore has no client config file: use --producer-property KEY=VALUE",
    "--consumer.config": "kstore has no client config file: use --consumer-property KEY=VALUE",
}

# Flags whose value follows them as the next argument (Kafka's tools take no '=' form).
_TAKES_VALUE = {
    "--bootstrap-server",
    "--bootstrap-servers",
    "--broker-list",
    "--zookeeper",
    "--command-config",
    "--replication-factor",
    "--replica-assignment",
    "--whitelist",
    "--include",
    "--timeout",
    "--producer.config",
    "--consumer.config",
}


# The console clients' --property NAME=VALUE, per command: the kstore options each one is.
_PROPERTIES: dict[str, dict[str, str]] = {
    "consume": {
        "print.key": "--print-key",
        "print.timestamp": "--print-timestamp",
        "print.offset": "--print-offset",
        "print.partition": "--print-partition",
        "print.headers": "--print-headers",
        "key.separator": "--key-separator",
    },
    "produce": {
        "parse.key": "--key-separator",
        "key.separator": "--key-separator",
        "parse.headers": "--headers",
    },
}


def _properties(verb: str, items: list[str]) -> list[str]:
    """``--property print.key=true`` -> ``--print-key`` (and the like)."""
    known = _PROPERTIES.get(verb)
    if known is None:
        raise UsageError(f"--property: 'kstore {verb}' takes none")
    given: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in known:
            raise UsageError(
                f"--property {item!r}: 'kstore {verb}' knows {', '.join(known)} "
                f"(see 'kstore {verb} --help')"
            )
        given[name] = value
    out: list[str] = []
    for name, value in given.items():
        flag = known[name]
        if name == "key.separator":
            if verb == "consume" or given.get("parse.key", "false").lower() == "true":
                out += [flag, value]
        elif name == "parse.key":
            if value.lower() == "true" and "key.separator" not in given:
                out += [flag, "\\t"]  # Kafka's default key separator: a tab
        elif value.lower() == "true":
            out.append(flag)
    return out


def _option_names(command: Any) -> set[str]:
    names: set[str] = set()
    for param in getattr(command, "params", []):
        if getattr(param, "param_type_name", "") == "option":
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def _takes_value(command: Any, name: str) -> bool:
    for param in getattr(command, "params", []):
        if getattr(param, "param_type_name", "") == "option" and name in param.opts:
            return not param.is_flag and not param.count
    return name in _TAKES_VALUE


def _argument_metavar(command: Any) -> str:
    """The metavar of the command's first positional argument ('' when it has none)."""
    for param in getattr(command, "params", []):
        if getattr(param, "param_type_name", "") == "argument":
            return str(param.metavar or param.name or "").upper()
    return ""


def _walk(root: Any, args: list[str]) -> tuple[list[tuple[str, Any, int]], int]:
    """The commands named on the line, each with its name and index, and where the leaf's
    own arguments start."""
    path: list[tuple[str, Any, int]] = [("", root, -1)]
    command = root
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            break
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            break
        if token in subcommands:
            command = subcommands[token]
            path.append((token, command, i))
            i += 1
            continue
        if not token.startswith("-"):
            break
        name = token.partition("=")[0]
        i += 2 if "=" not in token and _takes_value(command, name) else 1
    return path, i


def _rewrite_action(root: Any, args: list[str]) -> list[str]:
    """``kstore topics --create ...`` -> ``kstore topics create ...``."""
    path, _ = _walk(root, args)
    name, group, index = path[-1]
    actions = _ACTIONS.get(name)
    if actions is None or not hasattr(group, "commands"):
        return args
    rest = args[index + 1 :]
    end = rest.index("--") if "--" in rest else len(rest)
    found = [t for t in rest[:end] if t in actions]
    if not found:
        return args
    if len(set(found)) > 1:
        raise UsageError(f"give one of {', '.join(dict.fromkeys(found))} (kstore {name} <command>)")
    flag = found[0]
    verb = actions[flag]
    if name == "topics" and verb == "alter" and "--partitions" in rest[:end]:
        verb = "add-partitions"  # kafka-topics --alter --partitions N
    if verb not in group.commands:
        raise UsageError(f"{flag}: kstore has no 'kstore {name} {verb}'")
    kept = [t for t in rest if t != flag]
    if name == "topics" and verb == "list":
        kept.append("--names-only")  # kafka-topics --list prints the names alone
    return [*args[: index + 1], verb, *kept]


def translate(root: Any, args: list[str]) -> list[str]:
    """The command line with Kafka's flags turned into kstore's, or a UsageError naming the
    kstore form of a Kafka flag that has none here."""
    args = _rewrite_action(root, list(args))
    path, start = _walk(root, args)
    verb = " ".join(name for name, _, _ in path[1:])
    leaf = path[-1][1]
    if hasattr(leaf, "commands"):
        return args  # no command chosen yet: click says what is missing
    known = _option_names(leaf) | {"-h", "--help"}
    group_actions = _ACTIONS.get(path[-2][0], {}) if len(path) > 2 else {}
    metavar = _argument_metavar(leaf)
    out = args[:start]
    properties: list[str] = []
    i = start
    while i < len(args):
        token = args[i]
        if token == "--":
            out.extend(args[i:])
            break
        name, eq, inline = token.partition("=")
        if not token.startswith("--") or name in known:
            out.append(token)
            i += 1
            continue
        if name in group_actions:
            if group_actions[name] != path[-1][0]:
                raise UsageError(
                    f"{name} is 'kstore {path[-2][0]} {group_actions[name]}' here, "
                    f"not 'kstore {verb}'"
                )
            i += 1  # the command already is that action
            continue
        if name in ("--topic", "--group"):
            wanted = name[2:].upper()
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
            # topics list takes a PATTERN: Kafka's --list --topic is a regular expression too
            takes = wanted in metavar or (wanted == "TOPIC" and "PATTERN" in metavar)
            if takes and value is not None:
                out.append(value)  # Kafka's --topic T is the TOPIC argument
                i += 1 if eq else 2
                continue
            raise UsageError(f"'kstore {verb}' takes no {name}: see 'kstore {verb} --help'")
        if name == "--property":
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            properties.append(value)
            i += 1 if eq else 2
            continue
        if name in _REFUSED:
            raise UsageError(f"{name}: {_REFUSED[name]}")
        out.append(token)
        i += 1
    if properties:
        tail = out.index("--") if "--" in out else len(out)
        out[tail:tail] = _properties(verb, properties)
    return out
