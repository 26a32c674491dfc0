"""`python -m slicekeeper.supervisor --plan plan.json --host N`: one host's supervisor."""

import sys

from slicekeeper.supervisor.host import main

sys.exit(main())
