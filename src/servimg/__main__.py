"""`python -m servimg …`: the same CLI as the `servimg` script (for an environment without the script on
PATH, e.g. a checkout run with PYTHONPATH=src)."""

import sys

from servimg.cli import main

sys.exit(main())
