from ._serve import main

raise SystemExit(main())
