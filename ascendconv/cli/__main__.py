"""`python -m ascendconv.cli`: the same command line as the `ascendconv` script (Python imports this
package, the command line, before the entry can listen for a Ctrl-C: `python -m ascendconv` does not)."""

from ascendconv.entry import main

main()
