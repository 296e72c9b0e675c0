from harness.trainer.main import main

raise SystemExit(main())
