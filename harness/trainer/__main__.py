"""`python -m harness.trainer`: run, then end the process the way the zygote ends its ranks
(harness.contracts.rank_exit says why without interpreter finalization)."""
from harness.contracts.rank_exit import end
from harness.trainer.main import main

end(main)
