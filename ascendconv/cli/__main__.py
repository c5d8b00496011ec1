"""`python -m ascendconv.cli`: the same command line as the `ascendconv` script."""

from ascendconv.cli import app

app(prog_name="ascendconv")
