"""A log file that cannot be written (a full disk) costs one warning, not a traceback per line.

Python's logging prints ``--- Logging error ---`` and a traceback on stderr for every record a
handler fails to write: a full disk turned one request into nine tracebacks, 425 lines of
stderr (issue 21, item 7). :class:`QuietFileHandler` says once that the file is not being
written and why, stays quiet while it keeps failing, and says so when writing works again;
the daemon keeps serving either way.
"""

from __future__ import annotations

import logging
import sys


class QuietFileHandler(logging.FileHandler):
    """A FileHandler whose write failures are one line on stderr per outage."""

    failing = False  # an outage is under way (said once)
    _failed_now = False  # the record being emitted failed

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)  # calls handleError on failure
        if self.failing and not self._failed_now:
            self.failing = False
            _say(f"modeld: writing {self.baseFilename} works again")
        self._failed_now = False

    def handleError(self, record: logging.LogRecord) -> None:
        self._failed_now = True
        if self.failing:
            return
        self.failing = True
        exc = sys.exc_info()[1]
        _say(f"modeld: cannot write the log file {self.baseFilename} ({exc}); its lines are "
             "lost until it can be written again (free some space?); the daemon keeps serving "
             "and logs to stderr meanwhile")


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
