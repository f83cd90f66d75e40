from runnerd.cli import main

raise SystemExit(main())
