from ._main import leave, main

raise SystemExit(leave(main()))
