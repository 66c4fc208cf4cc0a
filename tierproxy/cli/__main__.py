"""`python -m tierproxy.cli`: the `tierproxy` command."""

import sys

from tierproxy.cli import main

sys.exit(main())
