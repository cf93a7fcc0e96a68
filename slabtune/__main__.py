from slabtune.cli import main

raise SystemExit(main())
