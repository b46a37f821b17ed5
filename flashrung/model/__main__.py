"""``python -m flashrung.model model ...``: the model subcommand without the package CLI."""
import sys

from flashrung.model.cli import main

sys.exit(main())
