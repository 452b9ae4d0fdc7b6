"""``python -m indextts_client.wyoming``: as ``indextts-client wyoming``."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
