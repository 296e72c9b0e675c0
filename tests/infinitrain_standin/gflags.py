"""A small gflags look-alike: the parsing and reporting rules of gflags' (v2.2, InfiniTrain's
third_party/gflags at e171aa2) ``ParseCommandLineFlags(&argc, &argv, true)``.

Parsing (src/gflags.cc, ``ParseNewCommandLineFlags`` / ``SplitArgumentLocked``):
- ``--name=value``, ``--name value``, ``-name=value``, ``-name value``;
- bools: ``--flag``, ``--noflag``, ``--flag=true|false|1|0|yes|no|t|f|y|n`` (a bool never eats
  the next argument);
- non-flag arguments are permuted to the end, ``--`` stops flag parsing;
- errors are collected per flag name and reported together, sorted by name, *after* the help
  flags have been handled (``ReportErrors`` runs after ``HandleCommandLineHelpFlags``): an
  unknown flag -> ``ERROR: unknown command line flag 'x'`` (unless named in ``--undefok``; the
  last ``--undefok`` wins, it is an ordinary string flag), bad values / validators -> gflags'
  ERROR messages; then exit 1. A flag missing its argument stops parsing there.

gflags' own flags are registered as in the real library (so they are accepted and listed):
``flagfile``, ``fromenv``, ``tryfromenv``, ``undefok`` (src/gflags.cc:119-128),
``tab_completion_word``, ``tab_completion_columns`` (src/gflags_completions.cc:68-73) and the
reporting flags ``help``, ``helpfull``, ``helpshort``, ``helpon``, ``helpmatch``, ``helppackage``,
``helpxml``, ``version`` (src/gflags_reporting.cc:65-72). glog's flags are *not* registered:
InfiniTrain builds glog with ``WITH_GFLAGS OFF`` (CMakeLists.txt:42), so ``--logtostderr`` is an
unknown flag there and glog reads only its ``GLOG_*`` environment variables.

Reporting (src/gflags_reporting.cc): ``--helpxml`` prints ``ShowXMLOfFlags``' document on stdout
(flags sorted by file name, then flag name; only ``&`` and ``<`` escaped, as gflags' XMLText) and
exits 1; ``--help`` / ``--helpfull`` print the text listing (``DescribeOneFlag``'s 80-column
wrapping), ``--helpshort`` / ``--helpon`` / ``--helpmatch`` / ``--helppackage`` the filtered ones,
all exit 1; ``--version`` prints the program name and exits 0.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}

USAGE = "Warning: SetUsageMessage() never called"  # gflags.cc ProgramUsage(): no SetUsageMessage


@dataclass
class Flag:
    name: str
    kind: str  # bool | int32 | uint32 | int64 | uint64 | double | string
    default: Any
    validator: Callable[[Any], bool] | None = None
    meaning: str = ""
    file: str = ""


class FlagError(Exception):
    pass


_GF = "src/gflags.cc"
_GC = "src/gflags_completions.cc"
_GR = "src/gflags_reporting.cc"

# gflags' own flags: (name, type, default, meaning, file)
GFLAGS_OWN = [
    ("flagfile", "string", "", "load flags from file", _GF),
    ("fromenv", "string", "", "set flags from the environment [use 'export FLAGS_flag1=value']", _GF),
    ("tryfromenv", "string", "", "set flags from the environment if present", _GF),
    ("undefok", "string", "", "comma-separated list of flag names that it is okay to specify on the "
     "command line even if the program does not define a flag with that name.  IMPORTANT: flags in "
     "this list that have arguments MUST use the flag=value format", _GF),
    ("tab_completion_word", "string", "", "If non-empty, HandleCommandLineCompletions() will hijack the "
     "process and attempt to do bash-style command line flag completion on this value.", _GC),
    ("tab_completion_columns", "int32", 80, "Number of columns to use in output for tab completion", _GC),
    ("help", "bool", False, "show help on all flags [tip: all flags can have two dashes]", _GR),
    ("helpfull", "bool", False, "show help on all flags -- same as -help", _GR),
    ("helpshort", "bool", False, "show help on only the main module for this program", _GR),
    ("helpon", "string", "", "show help on the modules named by this flag value", _GR),
    ("helpmatch", "string", "", "show help on modules whose name contains the specified substr", _GR),
    ("helppackage", "bool", False, "show help on all modules in the main package", _GR),
    ("helpxml", "bool", False, "produce an xml version of help", _GR),
    ("version", "bool", False, "show version and build info and exit", _GR),
]


def with_gflags_flags(flags: dict[str, Flag]) -> dict[str, Flag]:
    """The program's flags plus gflags' own, as a gflags-linked binary registers them."""
    out = dict(flags)
    for name, kind, default, meaning, file in GFLAGS_OWN:
        out.setdefault(name, Flag(name, kind, default, None, meaning, file))
    return out


def to_string(kind: str, v: Any) -> str:
    """gflags' FlagValue::ToString (src/gflags.cc): bools true/false, doubles %.17g."""
    if kind == "bool":
        return "true" if v else "false"
    if kind == "double":
        return "%.17g" % v
    return str(v)


def _convert(flag: Flag, text: str) -> Any:
    k = flag.kind
    bad = FlagError(f"ERROR: illegal value '{text}' specified for {k} flag '{flag.name}'\n")
    if k == "bool":
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise bad
    if k in ("int32", "uint32", "int64", "uint64"):
        t = text.strip()
        try:
            v = int(t, 0) if t.lower().lstrip("+-").startswith("0x") else int(t, 10)
        except ValueError:
            raise bad
        bits = 32 if k.endswith("32") else 64
        lo, hi = ((-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if not k.startswith("u") else (0, 2 ** bits - 1))
        if not lo <= v <= hi or (k.startswith("u") and t.startswith("-")):
            raise bad
        return v
    if k == "double":
        try:
            return float(text)
        except ValueError:
            raise bad
    return text


class Parser:
    def __init__(self, flags: dict[str, Flag]):
        self.flags = flags
        self.values = {name: f.default for name, f in flags.items()}
        self.modified: set[str] = set()
        self.errors: dict[str, str] = {}
        self.undefined: set[str] = set()

    def _lookup(self, body: str):
        """SplitArgumentLocked: (flag, key, value or None); flag None -> error recorded."""
        if "=" in body:
            key, value = body.split("=", 1)
        else:
            key, value = body, None
        flag = self.flags.get(key)
        if flag is None:
            cand = self.flags.get(key[2:]) if key.startswith("no") else None
            if cand is None:
                self.undefined.add(key)
                self.errors[key] = f"ERROR: unknown command line flag '{key}'\n"
                return None, key, value
            if cand.kind != "bool":
                self.undefined.add(key)
                self.errors[key] = f"ERROR: boolean value ({key}) specified for {cand.kind} command line flag\n"
                return None, key, value
            return cand, cand.name, "0"
        if value is None and flag.kind == "bool":
            value = "1"
        return flag, key, value

    def set(self, flag: Flag, value: str) -> None:
        """ProcessSingleOptionLocked: parse, validate, then the recursive flags."""
        try:
            v = _convert(flag, value)
        except FlagError as e:
            self.errors[flag.name] = str(e)
            return
        if flag.validator is not None and not flag.validator(v):
            self.errors[flag.name] = (f"ERROR: failed validation of new value '{to_string(flag.kind, v)}' "
                                      f"for flag '{flag.name}'\n")
            return
        self.values[flag.name] = v
        self.modified.add(flag.name)
        if flag.name == "flagfile" and v:
            for fn in str(v).split(","):
                self._flagfile(fn.strip())
        elif flag.name in ("fromenv", "tryfromenv") and v:
            self._fromenv(str(v), flag.name == "fromenv")

    def _flagfile(self, fn: str) -> None:
        # ProcessFlagfileLocked / ProcessOptionsFromStringLocked: one "--name[=value]" a line,
        # '#' comments; lines without a leading '-' (file-name globs) are not handled here.
        try:
            with open(fn) as f:
                text = f.read()
        except OSError as e:
            sys.stderr.write(f"{fn}: {e.strerror}\n")  # PFATAL(filename): perror, exit 1
            sys.exit(1)
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("-") or line.startswith("#"):
                continue
            body = line[2:] if line.startswith("--") else line[1:]
            flag, key, value = self._lookup(body)
            if flag is None:
                continue
            if value is None:
                self.errors[key] = f"ERROR: flag '{line}' is missing its argument\n"
                continue
            self.set(flag, value)

    def _fromenv(self, names: str, strict: bool) -> None:
        for name in [s for s in names.split(",") if s]:
            flag = self.flags.get(name)
            if flag is None:
                self.errors[name] = (f"ERROR: unknown command line flag '{name}' "
                                     "(via --fromenv or --tryfromenv)\n")
                continue
            env = "FLAGS_" + name
            if env not in os.environ:
                if strict:
                    self.errors[name] = f"ERROR: {env} not found in environment\n"
                continue
            self.set(flag, os.environ[env])

    def parse(self, argv: list[str]) -> list[str]:
        args = list(argv)
        positional: list[str] = []
        after: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if not arg.startswith("-") or arg == "-":
                positional.append(arg)
                i += 1
                continue
            body = arg[2:] if arg.startswith("--") else arg[1:]
            if body == "":
                after = args[i + 1:]
                break
            flag, key, value = self._lookup(body)
            if flag is None:
                i += 1
                continue
            if value is None:
                if i + 1 >= len(args):
                    msg = f"ERROR: flag '{arg}' is missing its argument"
                    if flag.meaning:
                        msg += "; flag description: " + flag.meaning
                    self.errors[key] = msg + "\n"
                    break  # gflags: an unrecoverable error
                # positionals already met were permuted to the end, so the value is the next
                # argument even when it does not start with '-'
                value = args[i + 1]
                i += 1
            self.set(flag, value)
            i += 1
        return after + positional

    def report(self) -> str:
        undefok = [s for s in str(self.values.get("undefok", "")).split(",") if s]
        for name in undefok:
            if name in self.undefined:
                self.errors[name] = ""
            elif "no" + name in self.undefined:
                self.errors["no" + name] = ""
        return "".join(self.errors[k] for k in sorted(self.errors) if self.errors[k])


def parse(argv: list[str], flags: dict[str, Flag]) -> tuple[dict[str, Any], list[str]]:
    """Parse ``argv`` (without argv[0]); raises FlagError with gflags' report on errors."""
    p = Parser(flags)
    rest = p.parse(argv)
    err = p.report()
    if err:
        raise FlagError(err)
    return p.values, rest


# --------------------------------------------------------------------------------------------
# reporting

def _xml_text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;")  # gflags' XMLText: & and < only


def _infos(flags: dict[str, Flag], values: dict, modified: set) -> list[dict]:
    out = []
    for f in flags.values():
        out.append({"file": f.file, "name": f.name, "meaning": f.meaning, "type": f.kind,
                    "default": to_string(f.kind, f.default), "current": to_string(f.kind, values[f.name]),
                    "is_default": f.name not in modified})
    out.sort(key=lambda d: (d["file"].encode(), d["name"].encode()))  # FilenameFlagnameCmp: strcmp
    return out


def xml_listing(prog: str, flags: dict[str, Flag], values: dict | None = None,
                modified: set | None = None) -> str:
    values = values if values is not None else {n: f.default for n, f in flags.items()}
    lines = ['<?xml version="1.0"?>', "<AllFlags>", f"<program>{_xml_text(os.path.basename(prog))}</program>",
             f"<usage>{_xml_text(USAGE)}</usage>"]
    for d in _infos(flags, values, modified or set()):
        lines.append("<flag>" + "".join(f"<{t}>{_xml_text(d[t])}</{t}>" for t in
                                        ("file", "name", "meaning", "default", "current", "type")) + "</flag>")
    lines.append("</AllFlags>")
    return "\n".join(lines) + "\n"


def _add_string(s: str, out: list, col: list) -> None:
    if col[0] + 1 + len(s) >= 80:
        out.append("\n      ")
        col[0] = 6
    else:
        out.append(" ")
        col[0] += 1
    out.append(s)
    col[0] += len(s)


def describe_flag(d: dict) -> str:
    """The text DescribeOneFlag produces (same line-breaking rule), written afresh."""
    s = f"    -{d['name']} ({d['meaning']})"
    out: list[str] = []
    col = [0]
    while True:
        nl = s.find("\n")
        if nl < 0 and col[0] + len(s) < 80:
            out.append(s)
            col[0] += len(s)
            break
        if 0 <= nl < 80 - col[0]:
            out.append(s[:nl])
            s = s[nl + 1:]
        else:
            ws = 80 - col[0] - 1
            while ws > 0 and not (ws < len(s) and s[ws].isspace()):
                ws -= 1
            if ws <= 0:
                out.append(s)
                col[0] = 80
                break
            out.append(s[:ws])
            col[0] += ws
            while ws < len(s) and s[ws].isspace():
                ws += 1
            s = s[ws:]
        if s == "":
            break
        out.append("\n      ")
        col[0] = 6
    q = (lambda v: f'"{v}"') if d["type"] == "string" else (lambda v: v)
    _add_string("type: " + d["type"], out, col)
    _add_string("default: " + q(d["default"]), out, col)
    if not d["is_default"]:
        _add_string("currently: " + q(d["current"]), out, col)
    return "".join(out) + "\n"


def text_listing(prog: str, flags: dict[str, Flag], values: dict, modified: set,
                 substrings: list[str] | None = None) -> str:
    out = [f"{os.path.basename(prog)}: {USAGE}\n"]
    last_file = None
    first_dir = True
    found = False
    for d in _infos(flags, values, modified):
        if substrings and not any(_file_matches(d["file"], s) for s in substrings):
            continue
        found = True
        if d["file"] != last_file:
            if os.path.dirname(d["file"]) != os.path.dirname(last_file or ""):
                if not first_dir:
                    out.append("\n\n")
                first_dir = False
            out.append(f"\n  Flags from {d['file']}:\n")
            last_file = d["file"]
        out.append(describe_flag(d))
    if substrings and not found:
        out.append("\n  No modules matched: use -help\n")
    return "".join(out)


def _file_matches(filename: str, target: str) -> bool:
    if target in filename:
        return True
    return target.startswith("/") and filename.startswith(target[1:])


def handle_help(prog: str, flags: dict[str, Flag], values: dict, modified: set) -> None:
    """HandleCommandLineHelpFlags: print and exit when a reporting flag is set."""
    base = os.path.basename(prog)
    own = [f"/{base}.", f"/{base}-main.", f"/{base}_main."]
    v = values
    text = None
    code = 1
    if v.get("helpshort"):
        text = text_listing(prog, flags, values, modified, own)
    elif v.get("help") or v.get("helpfull"):
        text = text_listing(prog, flags, values, modified)
    elif v.get("helpon"):
        text = text_listing(prog, flags, values, modified, [f"/{v['helpon']}."])
    elif v.get("helpmatch"):
        text = text_listing(prog, flags, values, modified, [v["helpmatch"]])
    elif v.get("helppackage"):
        text = ""  # no flag file named like /<prog>.cc: gflags only LOG(WARNING)s (to a file)
    elif v.get("helpxml"):
        text = xml_listing(prog, flags, values, modified)
    elif v.get("version"):
        text, code = f"{base}\n", 0
    if text is None:
        return
    sys.stdout.write(text)
    sys.stdout.flush()
    sys.exit(code)


def parse_or_exit(argv: list[str], flags: dict[str, Flag], prog: str = "") -> tuple[dict[str, Any], list[str]]:
    """ParseCommandLineFlags: parse, handle the help flags (exit), then report errors (exit 1)."""
    p = Parser(flags)
    rest = p.parse(argv)
    handle_help(prog or "program", flags, p.values, p.modified)
    err = p.report()
    if err:
        sys.stderr.write(err)
        sys.stderr.flush()
        sys.exit(1)
    return p.values, rest
