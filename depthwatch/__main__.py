from depthwatch.cli import main

raise SystemExit(main())
