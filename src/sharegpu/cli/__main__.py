"""`python -m sharegpu.cli`: the `sharegpu` command."""

from sharegpu.cli import main

main()
