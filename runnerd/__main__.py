from runnerd.cli.main import main

raise SystemExit(main())
