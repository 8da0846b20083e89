"""`python -m gmjit ...`: the `gmjit` command (gmjit/_cli.py)."""

from gmjit._cli import main

main()
