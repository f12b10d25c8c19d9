"""``python -m gpuprov``: the CLI, usable with only this directory on sys.path."""

import sys

from .cli.main import main

sys.exit(main())
