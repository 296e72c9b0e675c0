"""Counts of what issue 37 asks to be written once, read from the code by ast (no import of
the package, so it runs before and after a refactor alike).

    python benchmarks/house_metrics.py [--root DIR] [--json]

- option names: every `--harness-*`, `--gpus` and `--infinitrain-*` string literal in harness/,
  the places (file:line) and how many of them are not the one declaration each option needs;
- getoption reads: calls of `.getoption(` in harness/;
- getattr with a default: `getattr(x, "name", default)` calls in harness/, and those whose
  object is a config (its name holds `config` or `cfg`; pytest's `workerinput` left out);
- attribute names built from strings: `getattr` / `setattr` whose name is not a literal, in
  harness/assets/ and harness/trainer/models/, but in a module's `__getattr__` (PEP 562 lazy
  imports, which return a module's attribute by the name asked for);
- the longest function in harness/ (lines, file:name);
- harness-side imports of harness.trainer: import statements of `harness.trainer...` in files
  outside harness/trainer/ (the harness side);
- SIGKILL: every reference to `signal.SIGKILL` in code (a send, or a value handed to one), the
  places where "ending a process" is written.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

OPTION = re.compile(r"^--(harness-[a-z0-9-]+|gpus|infinitrain-[a-z0-9-]+)(=.*)?$")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "harness").rglob("*.py") if "__pycache__" not in p.parts)


def measure(root: Path) -> dict:
    options: dict[str, list[str]] = {}
    getoption, getattr_default, getattr_config, built_names = [], [], [], []
    longest = (0, "")
    trainer_imports, sigkill = [], []
    for path in _files(root):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), filename=rel)
        lazy = {id(n) for f in tree.body if isinstance(f, ast.FunctionDef)
                and f.name == "__getattr__" for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                match = OPTION.match(node.value)
                if match:
                    options.setdefault("--" + match.group(1), []).append(f"{rel}:{node.lineno}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > longest[0]:
                    longest = (length, f"{rel}:{node.lineno} {node.name}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and not rel.startswith(
                    "harness/trainer/"):
                names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                         else [a.name for a in node.names])
                if isinstance(node, ast.ImportFrom) and node.module == "harness":
                    names += [f"harness.{a.name}" for a in node.names]
                if any(n == "harness.trainer" or n.startswith("harness.trainer.") for n in names):
                    trainer_imports.append(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.Attribute) and node.attr == "SIGKILL":
                sigkill.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Call):
                func = node.func
                where = f"{rel}:{node.lineno}"
                if isinstance(func, ast.Attribute) and func.attr == "getoption":
                    getoption.append(where)
                if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 3:
                    getattr_default.append(where)
                    target = ast.unparse(node.args[0]).lower()
                    # pytest's config.workerinput exists on xdist workers only: asking for it
                    # with a default is xdist's documented test, not a guess at a model field
                    xdist = ast.unparse(node.args[1]) == "'workerinput'"
                    if ("config" in target or "cfg" in target) and not xdist:
                        getattr_config.append(where)
                if (isinstance(func, ast.Name) and func.id in ("getattr", "setattr")
                        and id(node) not in lazy
                        and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant)
                        and rel.startswith(("harness/assets/", "harness/trainer/models/"))):
                    built_names.append(where)
    places = sum(len(v) for v in options.values())
    return {
        "options": len(options),
        "option_name_places": places,
        "option_name_places_beyond_one_each": places - len(options),
        "option_places_by_name": {k: v for k, v in sorted(options.items())},
        "getoption_reads": len(getoption),
        "getoption_places": getoption,
        "getattr_with_default": len(getattr_default),
        "getattr_with_default_on_configs": getattr_config,
        "attribute_names_built_from_strings": built_names,
        "longest_function": {"lines": longest[0], "where": longest[1]},
        "harness_side_imports_of_trainer": trainer_imports,
        "sigkill_references": sigkill,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--json", action="store_true", help="everything, as JSON")
    args = parser.parse_args(argv)
    result = measure(args.root)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"options named in harness/: {result['options']}, at "
          f"{result['option_name_places']} places "
          f"({result['option_name_places_beyond_one_each']} beyond one each)")
    print(f"getoption reads: {result['getoption_reads']}")
    print(f"getattr with a default: {result['getattr_with_default']}, on configs: "
          f"{len(result['getattr_with_default_on_configs'])} "
          f"{result['getattr_with_default_on_configs']}")
    print(f"attribute names built from strings (assets, models): "
          f"{result['attribute_names_built_from_strings']}")
    print(f"longest function: {result['longest_function']['lines']} lines, "
          f"{result['longest_function']['where']}")
    print(f"harness-side imports of harness.trainer: "
          f"{len(result['harness_side_imports_of_trainer'])} "
          f"{result['harness_side_imports_of_trainer']}")
    print(f"signal.SIGKILL in code: {len(result['sigkill_references'])} "
          f"{result['sigkill_references']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
