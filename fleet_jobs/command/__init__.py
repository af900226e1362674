"""An existing program as a job: run once per item, its input a local file, its outputs the
files it leaves in a folder (see job.py, and docs/command-job.md)."""

from .job import CommandConfig, CommandConverter, CommandJob

JOB = CommandJob()

__all__ = ["JOB", "CommandConfig", "CommandConverter", "CommandJob"]
