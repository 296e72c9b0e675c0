"""A small gflags look-alike: the parsing rules of gflags' ParseCommandLineFlags(remove_flags=true).

- ``--name=value``, ``--name value``, ``-name=value``, ``-name value``;
- bools: ``--flag``, ``--noflag``, ``--flag=true|false|1|0|yes|no|t|f|y|n`` (a bool never eats the
  next argument);
- non-flag arguments are permuted to the end (as gflags does), ``--`` stops flag parsing;
- an unknown flag -> ``ERROR: unknown command line flag 'x'`` on stderr, exit 1, unless it is
  named in ``--undefok=a,b``;
- bad values / validators -> gflags' ERROR messages, exit 1.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}

# glog registers these with gflags, so gflags-linked binaries accept them too.
GLOG_FLAGS = {
    "logtostderr": ("bool", False), "alsologtostderr": ("bool", False),
    "logtostdout": ("bool", False), "colorlogtostderr": ("bool", False),
    "log_dir": ("string", ""), "minloglevel": ("int32", 0), "stderrthreshold": ("int32", 2),
    "v": ("int32", 0), "vmodule": ("string", ""), "max_log_size": ("uint32", 1800),
    "logbuflevel": ("int32", 0), "logbufsecs": ("int32", 30), "log_prefix": ("bool", True),
}


@dataclass
class Flag:
    name: str
    kind: str  # bool | int32 | uint32 | double | string
    default: Any
    validator: Callable[[Any], bool] | None = None


class FlagError(Exception):
    pass


def _convert(flag: Flag, text: str) -> Any:
    k = flag.kind
    if k == "bool":
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise FlagError(f"ERROR: illegal value '{text}' specified for bool flag '{flag.name}'")
    if k in ("int32", "uint32"):
        try:
            v = int(text, 0) if text.strip().lower().startswith(("0x", "-0x")) else int(text)
        except ValueError:
            raise FlagError(f"ERROR: illegal value '{text}' specified for {k} flag '{flag.name}'")
        lo, hi = (-(2**31), 2**31 - 1) if k == "int32" else (0, 2**32 - 1)
        if not lo <= v <= hi:
            raise FlagError(f"ERROR: illegal value '{text}' specified for {k} flag '{flag.name}'")
        return v
    if k == "double":
        try:
            return float(text)
        except ValueError:
            raise FlagError(f"ERROR: illegal value '{text}' specified for double flag '{flag.name}'")
    return text


def parse(argv: list[str], flags: dict[str, Flag]) -> tuple[dict[str, Any], list[str]]:
    """Parse ``argv`` (without argv[0]). Returns (values, remaining positional args in gflags'
    order). Raises FlagError with the exact gflags message."""
    values = {name: f.default for name, f in flags.items()}
    args = list(argv)
    positional: list[str] = []
    after_dashdash: list[str] = []
    undefok: set[str] = set()
    pending_unknown: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            i += 1
            continue
        body = arg[2:] if arg.startswith("--") else arg[1:]
        if body == "":
            after_dashdash = args[i + 1:]
            break
        if "=" in body:
            name, value = body.split("=", 1)
            has_value = True
        else:
            name, value, has_value = body, None, False
        if name == "undefok":
            if not has_value:
                if i + 1 >= len(args):
                    raise FlagError("ERROR: flag '--undefok' is missing its argument")
                value = args[i + 1]
                i += 1
            undefok |= {s for s in value.split(",") if s}
            i += 1
            continue
        flag = flags.get(name)
        negated = False
        if flag is None and name.startswith("no") and not has_value:
            cand = flags.get(name[2:])
            if cand is not None:
                if cand.kind != "bool":
                    raise FlagError(f"ERROR: boolean value ({arg}) specified for {cand.kind} "
                                    f"command line flag '{cand.name}'")
                flag, negated = cand, True
        if flag is None:
            pending_unknown.append(name)
            i += 1
            continue
        if flag.kind == "bool":
            v = False if negated else (True if not has_value else _convert(flag, value))
        else:
            if not has_value:
                if i + 1 >= len(args):
                    raise FlagError(f"ERROR: flag '{arg}' is missing its argument")
                value = args[i + 1]
                i += 1
            v = _convert(flag, value)
        if flag.validator is not None and not flag.validator(v):
            raise FlagError(f"ERROR: failed validation of new value '{value if value is not None else v}' "
                            f"for flag '{flag.name}'")
        values[flag.name] = v
        i += 1
    for name in pending_unknown:
        base = name[2:] if name.startswith("no") else name
        if name not in undefok and base not in undefok:
            raise FlagError(f"ERROR: unknown command line flag '{name}'")
    # gflags: flags removed; argv becomes [argv0] + args after "--" + permuted positionals
    return values, after_dashdash + positional


def parse_or_exit(argv: list[str], flags: dict[str, Flag]) -> tuple[dict[str, Any], list[str]]:
    try:
        return parse(argv, flags)
    except FlagError as e:
        sys.stderr.write(str(e) + "\n")
        sys.stderr.flush()
        sys.exit(1)


def with_glog_flags(flags: dict[str, Flag]) -> dict[str, Flag]:
    out = dict(flags)
    for name, (kind, default) in GLOG_FLAGS.items():
        out.setdefault(name, Flag(name, kind, default))
    return out
