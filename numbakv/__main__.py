"""`python -m numbakv ARGS`: the `numbakv` command line (`numbakv.cli`)."""

import sys

from numbakv.cli import command

sys.exit(command())
