"""``python -m fleet_jobs.text``: the text jobs' shared tools (``fleet_jobs.text.tools.cli``)."""

from fleet_jobs.text.tools.cli import main

if __name__ == "__main__":
    main()
