"""Which pytest node ids are cases of a config file (`<file>::tag/model/id`): under xdist the
controller learns the collected cases from its workers' node ids only."""

from __future__ import annotations

from pathlib import Path


def case_names(nodeids, config_path: Path) -> list[str]:
    """`tag/model/id` of the node ids that are cases of the config file (`<file>::<name>`)."""
    names = []
    for nodeid in nodeids:
        file_part, sep, name = str(nodeid).partition("::")
        if sep and Path(file_part).name == config_path.name and len(name.split("/")) == 3 \
                and "::" not in name:
            names.append(name)
    return names
