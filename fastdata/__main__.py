"""``python -m fastdata`` runs the command line."""

import sys

from fastdata.cli import main

sys.exit(main())
