"""``python -m gpuprov``: the CLI, usable with only this directory on sys.path."""

import sys

from .cli import main

sys.exit(main())
