"""The errors a job and the fleet share, and what each means: bad data fails the item for good
(InputError), a failed attempt may be retried (ItemFailed), a lost lease stops the attempt
(Cancelled), a bad option or an unknown job stops the run before it starts (ConfigError,
JobNotFound).

Below every other module of the contract, so the worker that catches them and the job that
raises them hold the same classes; a job reaches them through ``fleet.job``.
"""

from __future__ import annotations

from typing import Any, Mapping


class InputError(Exception):
    """The item's data is bad: retrying will not help. The message names the file."""


class ConfigError(Exception):
    """A job option is missing or invalid."""


class JobNotFound(Exception):
    pass


class ItemFailed(Exception):
    """This attempt at the item failed, and another may not (a program that exited non-zero):
    the message and ``detail`` (e.g. exit code, last lines of stderr) are kept in the lease."""

    def __init__(self, message: str, detail: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.detail = dict(detail or {})


class Cancelled(Exception):
    """The item's lease was taken over: stop, the work is discarded (raised by ``ctx.checkpoint``)."""
