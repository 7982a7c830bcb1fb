"""``python -m armor_core.cli``: the ``armor`` script."""

import sys

from armor_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
