"""`python -m harness.trainer`: run, then end the process the way the zygote ends its ranks
(harness.contracts.rank_exit says why without interpreter finalization).
`python -m harness.trainer replay ...`: a subject's traced step replayed module by module
(harness.trainer.replay), the one other thing the harness launches the trainer for."""
import sys

from harness.contracts.rank_exit import end

if sys.argv[1:2] == ["replay"]:
    from harness.trainer.replay import main as replay_main

    end(lambda: replay_main(sys.argv[2:]))
else:
    from harness.trainer.main import main

    end(main)
