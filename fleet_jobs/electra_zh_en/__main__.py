"""``python -m fleet_jobs.electra_zh_en``: the tools' former place, for scripts that call them so;
they are the text layer's now (``python -m fleet_jobs.text``: fleet_jobs/text/tools/cli.py)."""

from fleet_jobs.text.tools.cli import main

if __name__ == "__main__":
    main()
