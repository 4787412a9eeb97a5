"""`python -m kvbench`: the command line, as the `kvbench` script runs it."""
from kvbench.cli import main

main()
