"""`python -m servimg …`: the same CLI as the `servimg` script, served by the resident server like it
(servimg.resident.client; for an environment without the script on PATH, e.g. a checkout run with
PYTHONPATH=src)."""

import sys

from servimg.resident.client import main

sys.exit(main())
