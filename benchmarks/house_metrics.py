"""Counts of what issue 37 asks to be written once, read from the code by ast (no import of
the package, so it runs before and after a refactor alike).

    python benchmarks/house_metrics.py [--root DIR] [--json]

- option names: every `--harness-*`, `--gpus` and `--infinitrain-*` string literal in harness/,
  the places (file:line) and how many of them are not the one declaration each option needs;
- getoption reads: calls of `.getoption(` in harness/;
- getattr with a default: `getattr(x, "name", default)` calls in harness/, and those whose
  object is a model config (its name holds `config` or `cfg`);
- attribute names built from strings: `getattr` / `setattr` whose name is not a literal, in
  harness/assets/ and harness/trainer/models/;
- the longest function in harness/ (lines, file:name);
- harness-side imports of harness.trainer: import statements of `harness.trainer...` in files
  outside harness/trainer/ (the harness side);
- SIGKILL sends: calls that send signal.SIGKILL (`killpg` or `kill`), the places "ended" is
  written.
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
            elif isinstance(node, ast.Call):
                func = node.func
                where = f"{rel}:{node.lineno}"
                if isinstance(func, ast.Attribute) and func.attr == "getoption":
                    getoption.append(where)
                if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 3:
                    getattr_default.append(where)
                    target = ast.unparse(node.args[0]).lower()
                    if "config" in target or "cfg" in target:
                        getattr_config.append(where)
                if (isinstance(func, ast.Name) and func.id in ("getattr", "setattr")
                        and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant)
                        and rel.startswith(("harness/assets/", "harness/trainer/models/"))):
                    built_names.append(where)
                if (isinstance(func, (ast.Attribute, ast.Name))
                        and (func.attr if isinstance(func, ast.Attribute) else func.id)
                        in ("killpg", "kill")
                        and any("SIGKILL" in ast.unparse(a) for a in node.args)):
                    sigkill.append(where)
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
        "sigkill_sends": sigkill,
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
    print(f"SIGKILL sent at: {result['sigkill_sends']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
