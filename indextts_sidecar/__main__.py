from ._leave import finished  # first: its exit hook must run after every other (see _leave)
from ._main import main

raise SystemExit(finished(main()))
