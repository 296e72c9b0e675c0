"""Mutation testing of the verdict path: does the fast test tier notice when the code that
decides pass / fail is wrong?

    pip install -e '.[mutation]'
    python benchmarks/mutation.py                   # all of the scope, 2 workers
    python benchmarks/mutation.py --show            # and the diff of every survivor
    python benchmarks/mutation.py --only 'harness.compare.locate.*'

mutmut (configured in pyproject.toml's [tool.mutmut]) runs in a scratch copy of the working tree
(tracked and untracked, not ignored, files), so the checkout gets no `mutants/` folder and other
work in it is not disturbed. Each mutant (one operator, constant, comparison or call changed in
one function) is run against the tests that reach that function, from the fast tier listed in
`pytest_add_cli_args_test_selection`; a failing test kills it. Scope (SCOPE below): everything
under harness/compare (diff, verdicts, locator, failure text, disk policy), the runner's status
decisions (CaseRunner.run / _run / skip_reason) and failure text (diagnosis.py), and the
reference rule (harness.contracts.flags.role_of / reference_args).

Prints killed / survived / no tests / timeout per module and the score, killed (and timed out)
over all mutants in scope; survivors matching EQUIVALENT (mutants that cannot change any
observable result, each with its reason; docs/reliability.md) are listed apart, and the score
with them left out is printed too. Exit status 1 when an unexplained mutant survives.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEP = "\u01c1"  # mutmut's separator in a method's mutant name: x<SEP>Class<SEP>method

# Mutant-name patterns in scope (fnmatch; a name is module.x_function__mutmut_N).
SCOPE = (
    "harness.compare.*",
    f"harness.runner.case_runner.x{SEP}CaseRunner{SEP}run__mutmut_*",
    f"harness.runner.case_runner.x{SEP}CaseRunner{SEP}_run__mutmut_*",
    f"harness.runner.case_runner.x{SEP}CaseRunner{SEP}plan__mutmut_*",
    f"harness.runner.case_runner.x{SEP}CaseRunner{SEP}collect__mutmut_*",
    f"harness.runner.case_runner.x{SEP}CaseRunner{SEP}judge__mutmut_*",
    f"harness.runner.case_runner.x{SEP}CaseRunner{SEP}settle__mutmut_*",
    f"harness.runner.case_runner.x{SEP}CaseRunner{SEP}skip_reason__mutmut_*",
    # the record the stages above filled in until it was assembled from their results
    "harness.runner.record.x_assemble__mutmut_*",
    "harness.runner.record.x__*__mutmut_*",
    "harness.runner.diagnosis.*",
    "harness.contracts.flags.x_role_of__mutmut_*",
    "harness.contracts.flags.x_reference_args__mutmut_*",
)

# Survivors that cannot change an observable result: (name pattern, text of the mutated line,
# why). Matched against `mutmut show`'s diff ('+' line), so they survive renumbering.
EQUIVALENT: tuple[tuple[str, str, str], ...] = (
    ("harness.compare.baseline.x_bfloat16_loss_resolution__mutmut_*",
     "if abs(x - round(x / ulp) * ulp) >= _PRINTED_HALF_UNIT:",
     "the distance equals the slackened half unit only for a printed decimal 5.0000005e-7 from "
     "a bfloat16 value, which six decimals cannot print"),
    ("harness.compare.diff.x__layer_rank__mutmut_*", "else (_PART_ORDER[layer], 1)",
     "the second element only orders parts of the same first element, and each named part "
     "(embedding, final_norm, head, other) has its own first element"),
    ("harness.compare.locate.x*Locator*stages__mutmut_*", "self.chunks[0][1], self.chunks[-1][0]",
     "the first chunk in global order is stage 0's and starts at layer 0 in every layout the "
     "layout module accepts, so its stage and its start are both 0"),
    ("harness.runner.diagnosis.x_crash_text__mutmut_*", "result.returncode <= 0:",
     "crash_text is called only for a run that failed: exit code 0 comes with a fault or a "
     "problem (decided by the branches above) or a timeout, so 0 never reaches this test"),
    ("harness.runner.diagnosis.x_crash_text__mutmut_*", "result.returncode < 1:",
     "as above: exit code 0 never reaches the signal branch"),
    ("harness.compare.fastdiff.x__load_got__mutmut_*", "np.load(path, allow_pickle=None)",
     "numpy refuses pickles for any false allow_pickle; None is false"),
    ("harness.compare.fastdiff.x__load_got__mutmut_*", "np.load(path, )",
     "numpy's default is allow_pickle=False: the explicit argument states the rule, it does "
     "not change it"),
    ("harness.compare.dumps.x_settle_dumps__mutmut_*", "shutil.rmtree(gradients_dir, ",
     "the folder is the case's own and was just found to exist; rmtree fails only when "
     "something else removes it at the same moment, which nothing does"),
    ("harness.compare.render.x_gradient_markdown__mutmut_*", "if x.isdigit() else 1, x)",
     "the middle key only orders layer numbers; every non-number shares it whatever it is, "
     "and the first key already puts numbers before names"),
    (f"harness.runner.case_runner.x{SEP}CaseRunner{SEP}run__mutmut_*", "ok=False, overwrite=None)",
     "mark_checkpoint_done tests `overwrite or ...`: None is false, as False is"),
    ("harness.compare.fastdiff.x_diff_files__mutmut_*", "np.load(ref_path, allow_pickle=None)",
     "numpy refuses pickles for any false allow_pickle; None is false"),
    ("harness.compare.fastdiff.x_diff_files__mutmut_*", "np.load(ref_path, )",
     "numpy's default is allow_pickle=False"),
    # The block path: its answers are checked against the float64 path and the definitions;
    # these change only how it gets there (which elements are re-checked, buffer types).
    *(("harness.compare.fastdiff.x__block_stats__mutmut_*", text, why) for text, why in (
        ("isfinite(diff_sq) or", "got - ref is finite only where both are, so a finite "
         "||got - ref|| with a non-finite ||got|| or ||ref|| cannot happen"),
        ("allowed -= atol32", "the excess of every element shifts by the same 2 x atol, so the "
         "argmax is the same element, and its excess is recomputed in float64"),
        ("d >= near", "an element exactly at `near` (below atol) re-checked in float64 is "
         "within the bound either way"),
        ("if d[j] >= near", "as above: at `near` the float64 re-check finds it within"),
        ("excess >= -_HAIR", "an element exactly at the edge of the re-check band is within "
         "the bound; re-checked in float64 it is found within"),
        ("if (d[j] > near) or True", "an empty candidate search: slower, same count"),
        (".astype(None)", "astype(None) is float64"),
        ("np.empty(size, None)", "a float64 scratch buffer: the same argmax and a candidate "
         "set that the float64 re-check decides the same way"),
        ("np.empty(size, )", "as above: numpy's default dtype is float64"),
        ("if (rtol) or True else None", "a buffer allocated and not used when rtol is 0"),
        ("max_d, max_at = -2.0, 0", "overwritten by the first block: every |d| >= 0"),
        ("max_d, max_at = -1.0, 1", "overwritten by the first block"),
        ("-math.inf, 1, 0.0, 0.0", "overwritten by the first block: a finite excess > -inf"),
        ("-math.inf, 0, 1.0, 0.0", "overwritten by the first block"),
        ("-math.inf, 0, 0.0, 1.0", "overwritten by the first block"),
        ("max_got = max_ref = None", "overwritten by the first block"),
        ("max_got = max_ref = 1.0", "overwritten by the first block"),
        ("UnreadableError(None)", "unreachable: the file's byte count was checked before "
         "reading, so a short read needs the file cut while it is read"),
        ("ValueError(None)", "unreachable, as above"),
        ("cut shortXX", "unreachable, as above"),
        ("CUT SHORT", "unreachable, as above"),
    )),
    # TP shards: match_shard calls _group_sizes only with tp >= 2 and a total of n * tp rows
    ("harness.compare.tp_shards.x__group_sizes__mutmut_*", "all(g > 1 and g % tp == 0",
     "a group of 1 splits into tp equal parts only at tp 1, and at tp 1 a file of another "
     "shape is never n * tp rows of the reference: match_shard asks for no groups"),
    ("harness.compare.tp_shards.x__group_sizes__mutmut_*", "(total / 3) % tp == 0",
     "total % 3 == 0 is tested first, so total / 3 is a whole number with the same remainder "
     "by tp as total // 3"),
    *(("harness.compare.tp_shards.x__relative__mutmut_*", f"np.asarray(compared, {arg}).ravel()",
       "the reference is converted to float64, so got - ref is float64 whatever the file's "
       "float type (the conversion is exact)") for arg in ("None", "")),
    ("harness.compare.tp_shards.x_fused_qkv_groups__mutmut_*", "(rows + width) % 2",
     "rows + width and rows - width differ by 2 x width: the same parity"),
    ("harness.compare.tp_shards.x_match_shard__mutmut_*", "elif n * tp >= total > n * tp - n",
     "n * tp == total is the branch above, so the elif never sees it"),
    *(("harness.compare.tp_shards.x_match_shard__mutmut_*", text,
       "only the grouped candidates take add's default start and stop, and nothing reads a "
       "grouped match's start or stop: describe names a grouped part by its rank")
      for text in ("compared, start=1, stop=0,", "compared, start=0, stop=1,")),
    ("harness.compare.tp_shards.x_match_shard__mutmut_*", "_take(dumped, dim, None, keep)",
     "slice(None, keep) is slice(0, keep)"),
    *(("harness.compare.render.x_*_lines__mutmut_*", f"_some(diff.{items}, None)",
       "_some writes markdown only for MARKDOWN; any other value, None included, is text")
      for items in ("nonfinite", "missing", "extra")),
)


def tree_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return [p for p in out.split("\0") if p and (ROOT / p).is_file()]


def make_copy(dest: Path) -> None:
    for rel in tree_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def drop_missing_tests(tree: Path) -> None:
    """Test paths of the selection that this tree does not have (an older checkout) are left
    out, not an error."""
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text()
    start = text.index("pytest_add_cli_args_test_selection")
    end = text.index("]", start)
    block = text[start:end]
    for item in block.replace("\n", " ").split(","):
        path = item.strip().strip('"')
        if path.startswith("tests/") and not (tree / path).exists():
            block = block.replace(f'"{path}",', "")
    pyproject.write_text(text[:start] + block + text[end:])


def status_of(code) -> str:
    from mutmut.stats import status_by_exit_code

    return status_by_exit_code[code]


def results(tree: Path) -> dict[str, str]:
    found = {}
    for meta in (tree / "mutants").rglob("*.meta"):
        for name, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items():
            found[name] = status_of(code)
    return found


def in_scope(name: str, only: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in SCOPE) and \
        (not only or any(fnmatch.fnmatch(name, p) for p in only))


def show(tree: Path, name: str) -> str:
    return subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=tree,
                          capture_output=True, text=True).stdout


def equivalent_reason(name: str, diff: str) -> str | None:
    added = [l[1:].strip() for l in diff.splitlines() if l.startswith("+") and
             not l.startswith("+++")]
    for pattern, text, why in EQUIVALENT:
        if fnmatch.fnmatch(name, pattern) and any(text in line for line in added):
            return why
    return None


def module_of(name: str) -> str:
    return name.split(".x", 1)[0] if ".x" in name else name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--only", action="append", default=[],
                        help="mutant-name pattern(s) to run (within the scope)")
    parser.add_argument("--show", action="store_true", help="print every survivor's diff")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    parser.add_argument("--json", type=Path, help="write the counts and survivors here")
    args = parser.parse_args(argv)

    work = args.keep or Path(tempfile.mkdtemp(prefix="harness-mutation-"))
    tree = work / "tree"
    if tree.exists():
        shutil.rmtree(tree)
    make_copy(tree)
    drop_missing_tests(tree)
    patterns = args.only or list(SCOPE)
    started = time.time()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children",
                          str(args.max_children), *patterns], cwd=tree, env=env,
                         capture_output=True, text=True)
    elapsed = time.time() - started
    (work / "mutmut.log").write_text(run.stdout + run.stderr)
    found = {n: s for n, s in results(tree).items() if in_scope(n, args.only)}
    if run.returncode != 0 or not found:
        print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
        print(f"mutmut run failed (exit {run.returncode}); log: {work / 'mutmut.log'}")
        return 2

    per_module: dict[str, Counter] = {}
    survivors, equivalents = [], []
    for name in sorted(found):
        status = found[name]
        per_module.setdefault(module_of(name), Counter())[status] += 1
        if status in ("survived", "no tests", "suspicious"):
            diff = show(tree, name)
            why = equivalent_reason(name, diff)
            (equivalents if why else survivors).append((name, status, diff, why))

    total = Counter()
    print(f"{'module':40} {'mutants':>8} {'killed':>7} {'survived':>9} {'no tests':>9} "
          f"{'timeout':>8}")
    for module, counts in sorted(per_module.items()):
        total.update(counts)
        print(f"{module:40} {sum(counts.values()):8} {counts['killed']:7} "
              f"{counts['survived']:9} {counts['no tests']:9} {counts['timeout']:8}")
    mutants = sum(total.values()) - total["skipped"]
    detected = total["killed"] + total["timeout"]
    score = detected / mutants if mutants else 0.0
    explained = mutants - len(equivalents)
    print(f"{'total':40} {mutants:8} {total['killed']:7} {total['survived']:9} "
          f"{total['no tests']:9} {total['timeout']:8}")
    print(f"mutation score: {detected}/{mutants} = {100 * score:.1f}%"
          + (f"; {detected}/{explained} = {100 * detected / explained:.1f}% with "
             f"{len(equivalents)} equivalent mutant(s) left out" if equivalents else "")
          + f" ({elapsed / 60:.1f} min)")
    for name, status, diff, why in equivalents:
        print(f"equivalent: {name}: {why}")
    for name, status, diff, _ in survivors:
        print(f"{status}: {name}")
        if args.show:
            print("    " + "\n    ".join(l for l in diff.splitlines()
                                        if l.startswith(("+", "-")) and not l.startswith(("+++", "---"))))
    if args.json:
        args.json.write_text(json.dumps({
            "mutants": mutants, "detected": detected, "score": score,
            "counts": dict(total), "survivors": [s[0] for s in survivors],
            "equivalent": [e[0] for e in equivalents]}, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
