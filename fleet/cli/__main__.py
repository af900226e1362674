"""`python -m fleet.cli ...` (what the VMs' startup script runs)."""

from fleet.cli.commands import main

main()
