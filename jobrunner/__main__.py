"""`python -m jobrunner` runs the CLI."""

from jobrunner.cli import main

main()
