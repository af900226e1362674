"""`python -m fleet.cli ...` (what the VMs' startup script runs): the `fleet` command."""

from fleet.cli import main

main()
