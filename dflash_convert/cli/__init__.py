"""The command line, ``dflash-convert COMMAND ...``: a small package.

program.py runs one command line as a process (the guard: streams, signals, the one error line, the
exit-code table); commands.py is the table of commands and their parameters; handlers.py holds one
handler per command, which calls the API and prints its result's own rendering; command_line.py
parses argv against the table (standard library only). Parsing, -h and a usage error import nothing
a command runs. The commands and exit codes are in README.md.
"""

from .commands import COMMANDS
from .program import EXIT_REFUSED, EXIT_SIGPIPE, EXIT_UNREADABLE, EXIT_USAGE, _VisibleFormatter, exit_code, main

__all__ = ["COMMANDS", "EXIT_REFUSED", "EXIT_SIGPIPE", "EXIT_UNREADABLE", "EXIT_USAGE", "_VisibleFormatter", "exit_code",
           "main"]
