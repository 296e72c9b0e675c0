"""The commit that broke a case: `python -m harness.bisect --good REV --bad REV TAG/MODEL/ID`
drives `git bisect run` in the trainer's checkout with the case's verdict (or a tokens/s or
memory threshold) as the test, building each commit with the user's command (docs/bisect.md).
Torch-free.

    cli.py          `python -m harness.bisect`, the command line: checks, the bisect, the range's ends, the checkout restored
    git.py          the git plumbing: revisions, ancestry, a clean work tree, git bisect itself
    step.py         the test git bisect run calls at each commit: cache, build, session, verdict
    verdict.py      one case's session at one commit and its verdict, read from its record
    cache.py        finished commits' verdicts, so a second bisect builds and runs nothing
    summary.py      what a finished bisect says: the first bad commit, skips, the cost
"""
