"""`python -m ascendconv`: the same command line as the `ascendconv` script, from the same entry."""

from ascendconv.entry import main

main()
