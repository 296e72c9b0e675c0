"""Which pytest node ids are cases of a config file (`<file>::tag/model/id`): under xdist the
controller learns the collected cases from its workers' node ids only; and which cases a
`--harness-cases` selection keeps, matched on the case's own name alone."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path


def case_names(nodeids, config_path: Path) -> list[str]:
    """`tag/model/id` of the node ids that are cases of the config file (`<file>::<name>`).

    pytest gives a file outside the rootdir (one named by --harness-config only) an empty file
    part: `::tag/model/id`; that is the config file too, the only file such a session collects
    from outside its rootdir."""
    names = []
    for nodeid in nodeids:
        file_part, sep, name = str(nodeid).partition("::")
        ours = file_part == "" or Path(file_part).name == config_path.name
        if sep and ours and len(name.split("/")) == 3 and "::" not in name:
            names.append(name)
    return names


def case_line(path: Path, tag: str, case_id: str) -> int | None:
    """The 1-based line of a case's `"id": "<case_id>"` in its config file, the first after its
    group's `"tag": "<tag>"` line (so pytest's skip lines point at the case, not the plugin)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    tag_at = next((i for i, line in enumerate(lines)
                   if re.search(rf'"tag"\s*:\s*"{re.escape(tag)}"', line)), 0)
    pattern = re.compile(rf'"id"\s*:\s*"{re.escape(case_id)}"')
    return next((i + 1 for i in range(tag_at, len(lines)) if pattern.search(lines[i])), None)


def parse_case_patterns(text: str | None) -> tuple[str, ...]:
    """`--harness-cases`' comma list of `tag/model/id` patterns (`*` and `?` as in shell
    globs, per part), or ValueError naming the pattern and what was expected."""
    if not text:
        return ()
    patterns = tuple(item.strip() for item in text.split(",") if item.strip())
    for pattern in patterns:
        if len(pattern.split("/")) != 3 or "" in pattern.split("/"):
            raise ValueError(f"--harness-cases {pattern!r}: expected tag/model/id, each part a "
                             f"name or a glob (basic/gpt2/1, basic/*/4, lora/llama3/*)")
    return patterns


def case_selected(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether a case named `tag/model/id` matches one of `patterns` part by part: only the
    case's own name is matched, each part whole. pytest's `-k` matches substrings of every name
    above a case too: `-k 1` also selects every bfloat16 case, and where pytest matches the
    folders above (issue 48 saw it in a clone named `baseline1/`; not with pytest 9.2 here),
    every case of such a checkout."""
    parts = name.split("/")
    return any(all(fnmatch.fnmatchcase(part, glob) for part, glob in zip(parts, pattern.split("/")))
               for pattern in patterns)
