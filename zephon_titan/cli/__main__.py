"""`python -m zephon_titan.cli`: the `zephon-titan` command, where the console script is not installed."""

import sys

from zephon_titan.cli import main

sys.exit(main())
