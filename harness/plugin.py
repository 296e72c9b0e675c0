"""The pytest plugin (entry point `pytest11: harness = "harness.plugin"`): options, markers,
collection of the test config's cases, and one item per (tag, case, model). Hooks only; the
logic lives in harness.cases, harness.runner, harness.launch, harness.reference,
harness.compare and harness.results.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from harness.cases import ConfigError, Overrides, load_config, read_tags
from harness.cases.node_ids import case_line, case_names, case_selected, parse_case_patterns
from harness.results.location import DEFAULT_OUTPUT, env_output, record_last_session
from harness.runner.settings import (
    Options,
    Settings,
    declarations,
    join_option_value,
    named_configs,
    rootdir_problem,
)
from harness.session_folder import new_session_dir

_SETTINGS = pytest.StashKey[dict]()
_DERIVED = pytest.StashKey[Settings]()
_RUNNER = pytest.StashKey[object]()
_SESSION_KEY = "harness_session_dir"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "precision-regression harness")
    for flag, kwargs in declarations():  # the one option table: harness.runner.settings.Options
        group.addoption(flag, **kwargs)


# A late option's value starts with "--" (--harness-slurm-args), and argparse takes a lone word
# that starts with "--" for an option ("expected one argument"), so `--harness-slurm-args
# '--partition=x'` would be refused by the parse pytest makes right after loading plugins. Such
# options (`late` in the table) are therefore declared after that parse, with `OPTION VALUE`
# joined into `OPTION=VALUE` first.
@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> None:
    for flag, kwargs in declarations(late=True):
        args[:] = join_option_value(args, flag)
        parser.getgroup("harness").addoption(flag, **kwargs)


def _terminated(signum, frame) -> None:
    """SIGTERM (what `timeout` sends and CI escalates to) ends the session as Ctrl-C does:
    the running case's processes are ended on the way out, finished records are kept and the
    summary with the report command is printed."""
    raise KeyboardInterrupt(f"terminated by {signal.Signals(signum).name}")


_PREVIOUS_SIGTERM = pytest.StashKey[object]()


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():
        config.stash[_PREVIOUS_SIGTERM] = signal.signal(signal.SIGTERM, _terminated)
    invocation = config.invocation_params
    problem = rootdir_problem(list(invocation.args), invocation.dir, config.rootpath,
                              config.inipath)
    if problem:
        raise pytest.UsageError(problem)
    try:
        options = Options.from_pytest(config.getoption)
        options.check()
        path = options.config_path(named_configs(config.args), config.rootpath)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    config.addinivalue_line("markers", "harness: a precision case expanded from the test config")
    for tag in read_tags(path):
        config.addinivalue_line("markers", f"{tag}: test config tag {tag!r} ({path.name})")
    if options.config:
        if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
            # `pytest --harness-config X` alone runs X's cases, not the ini's testpaths too.
            config.args[:] = [str(path)]
        elif not any(path == Path(a.split("::")[0]).resolve() or Path(a).resolve() in path.parents
                     for a in config.args):
            config.args.append(str(path))
    output = options.output_dir(config.rootpath, env_output(), DEFAULT_OUTPUT)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and _SESSION_KEY in workerinput:
        session_dir = Path(workerinput[_SESSION_KEY])
        worker = workerinput.get("workerid", "worker")
    else:
        session_dir = new_session_dir(output / "sessions")
        worker = "main"
    config.stash[_SETTINGS] = {
        "options": options, "config_path": path, "output": output, "session_dir": session_dir,
        "worker": worker, "reference_root": options.reference_root(output),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "header": None,
        "calibration": [],  # what a calibration session wrote (the terminal's lines)
        "history": None,  # the history line: what this session appended (harness.history)
        "notes": [],  # the config's notes (InfiniTrain keys set aside, unknown flags, ...)
    }
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(config, session_dir), "harness-xdist")


def _is_controller(config: pytest.Config) -> bool:
    """The process that owns the session: not an xdist worker."""
    return getattr(config, "workerinput", None) is None and _SETTINGS in config.stash


def _record_collected(config: pytest.Config, names: list[str]) -> None:
    """Write (or extend) the session header with the collected case names: the controller
    only, and only when the session runs harness cases (so plain test runs leave no folder)."""
    from harness.results.session import new_header, write_header

    s = config.stash[_SETTINGS]
    if not names or config.option.collectonly:
        return
    if s["header"] is None:
        s["header"] = new_header(s["session_dir"].name, s["started_at"], s["config_path"],
                                 config.rootpath, config.invocation_params.args,
                                 trainer=_trainer(config),
                                 settings=_settings(config).record(s["options"]))
    collected = s["header"]["collected"]
    collected.extend(n for n in names if n not in collected)
    write_header(s["session_dir"], s["header"])


def _trainer(config: pytest.Config) -> dict | None:
    """The trainer under test, for the header and the summary (the controller, which under
    xdist collects nothing itself, reads the config once more), and the config's notes for
    the summary (harness.cases HarnessConfig.notes: said once per session)."""
    from harness.runner.case_runner import trainer_identity

    try:
        harness_config = load_config(config.stash[_SETTINGS]["config_path"], _overrides(config))
    except (ConfigError, OSError, pytest.UsageError):
        return None
    config.stash[_SETTINGS]["notes"] = list(harness_config.notes)
    return trainer_identity(harness_config, _settings(config).device)


def _settings(config: pytest.Config) -> Settings:
    """The session's Settings, derived once per process when first needed: resolving the
    device may import torch, which a pytest run without harness cases never pays for."""
    if _DERIVED not in config.stash:
        s = config.stash[_SETTINGS]
        config.stash[_DERIVED] = Settings.from_options(s["options"], s["session_dir"],
                                                       s["reference_root"], s["worker"])
    return config.stash[_DERIVED]


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """--harness-cases: keep the cases whose own name matches (harness.cases.node_ids)."""
    patterns = parse_case_patterns(config.stash[_SETTINGS]["options"].cases)
    if not patterns:
        return
    kept, dropped = [], []
    for item in items:
        selected = not isinstance(item, HarnessCaseItem) or case_selected(item.case.name, patterns)
        (kept if selected else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    items = [item for item in session.items if isinstance(item, HarnessCaseItem)]
    if items and not session.config.option.collectonly:
        for item in items:  # every worker: checkpoints its selected cases will save
            _runner(session.config, item.parent.harness_config).announce(item.case)
    if _is_controller(session.config):
        _record_collected(session.config, [item.case.name for item in session.items
                                           if isinstance(item, HarnessCaseItem)])


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if _is_controller(config) and config.stash[_SETTINGS]["header"] is not None:
        from harness.results.session import now, write_header

        s = config.stash[_SETTINGS]
        s["header"]["finished_at"] = now()
        write_header(s["session_dir"], s["header"])
        record_last_session(s["session_dir"])  # python -m harness.report finds it from anywhere
        from harness.history.store import append_session

        try:  # the nights' history beside the sessions (python -m harness.history)
            s["history"] = append_session(s["session_dir"], s["output"])
        except (OSError, ValueError) as error:  # the session's own results stand either way
            s["history"] = f"not appended ({error})"
        results = s["session_dir"] / "results.jsonl"
        if results.is_file():  # checkpoints go as the other dumps of passing cases go
            from harness.runner.checkpoints import settle_session_checkpoints

            settle_session_checkpoints(results, s["options"].keep_dumps)
        if s["options"].calibrate_repeats:  # every worker's measurements, merged
            from harness.runner.calibrate import write_calibrations

            s["calibration"] = write_calibrations(s["session_dir"], s["reference_root"],
                                                  s["options"].calibrate_repeats)
        max_gb = s["options"].reference_cache_max_gb
        if max_gb and max_gb > 0:
            from harness.reference.prune import prune

            prune(s["reference_root"], max_bytes=int(max_gb * 1e9))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _PREVIOUS_SIGTERM in config.stash:
        signal.signal(signal.SIGTERM, config.stash[_PREVIOUS_SIGTERM])


class _XdistHooks:
    def __init__(self, config: pytest.Config, session_dir: Path) -> None:
        self.config = config
        self.session_dir = session_dir

    def pytest_configure_node(self, node) -> None:  # every worker shares one session folder
        node.workerinput[_SESSION_KEY] = str(self.session_dir)

    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        """Under xdist the controller collects nothing itself: its workers report node ids."""
        if _is_controller(self.config):
            _record_collected(self.config,
                              case_names(ids, self.config.stash[_SETTINGS]["config_path"]))


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.suffix == ".json" and file_path.resolve() == parent.config.stash[_SETTINGS]["config_path"]:
        return HarnessConfigFile.from_parent(parent, path=file_path)
    return None


def _overrides(config: pytest.Config) -> Overrides:
    try:
        return config.stash[_SETTINGS]["options"].overrides()
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


class HarnessConfigFile(pytest.File):
    def collect(self):
        self.harness_config = load_config(self.path, _overrides(self.config))
        for case in self.harness_config.cases:
            item = HarnessCaseItem.from_parent(self, name=case.name, case=case)
            item.add_marker("harness")
            item.add_marker(case.tag)
            yield item

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConfigError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


class CaseFailed(Exception):
    """A case that ran and failed; str() is the whole diagnosis."""


class HarnessCaseItem(pytest.Item):
    def __init__(self, *, case, **kwargs) -> None:
        super().__init__(**kwargs)
        self.case = case

    def runtest(self) -> None:
        from harness.results import ResultsWriter, junit_properties

        runner = _runner(self.config, self.parent.harness_config)
        outcome = runner.run(self.case, self.nodeid)
        ResultsWriter(runner.settings.session_dir / "results.jsonl").append(outcome.record)
        self.user_properties.extend(junit_properties(outcome.record))
        if outcome.status == "skipped":
            pytest.skip(outcome.message)
        if outcome.status != "passed":
            raise CaseFailed(outcome.message)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.case.name} ({self.case.source})"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped case's summary line points at the case in its config, not at this file."""
    report = (yield).get_result()
    if report.skipped and isinstance(item, HarnessCaseItem) and \
            isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        line = case_line(item.path, item.case.tag, item.case.case_id)
        report.longrepr = (str(item.path), line, report.longrepr[2])


def _runner(config: pytest.Config, harness_config):
    if _RUNNER not in config.stash:
        from harness.runner import CaseRunner

        s = config.stash[_SETTINGS]
        s["session_dir"].mkdir(parents=True, exist_ok=True)
        config.stash[_RUNNER] = CaseRunner(harness_config, _settings(config))
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and getattr(config, "workerinput", None) is None:
            config.stash[_RUNNER].progress = lambda text: reporter.write_line(f"[harness] {text}")
    return config.stash[_RUNNER]


@pytest.hookimpl(trylast=True)  # after other plugins' sections: the last thing before the result line
def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if not _is_controller(config):
        return
    from harness.results.summary import summary_lines

    s = config.stash[_SETTINGS]
    added = [f"config: {note}" for note in s["notes"]] + list(s["calibration"]) + (
        [f"history: {s['history']}"] if s["history"] is not None else [])
    lines = summary_lines(s["session_dir"], (s["header"] or {}).get("trainer"), added)
    if lines:
        terminalreporter.section("harness session", sep="-")
    for line in lines:
        terminalreporter.write_line(line)
