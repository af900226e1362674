"""``python -m fleet_jobs.text``: the text jobs' shared tools (``fleet_jobs.text.tools``)."""

from fleet_jobs.text.tools import main

if __name__ == "__main__":
    main()
