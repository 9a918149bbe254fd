"""Edge: ``python -m polygate_celery`` runs the command line."""

import sys

from polygate_celery.cli import main

sys.exit(main())
