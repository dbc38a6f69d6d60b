"""`python -m jobrunner` runs the CLI."""

from jobrunner.entry import main

main()
