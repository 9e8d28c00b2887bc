"""The command line, ``dflash-convert COMMAND ...``: a small package.

program.py: the process guard and exit codes; commands.py: the command table; handlers.py: one
handler per command; command_line.py: the argv parser. Parsing, -h and a usage error import nothing
a command runs. The commands and exit codes are in README.md.
"""

from .commands import COMMANDS
from .program import EXIT_REFUSED, EXIT_SIGPIPE, EXIT_UNREADABLE, EXIT_USAGE, _VisibleFormatter, exit_code, main

__all__ = ["COMMANDS", "EXIT_REFUSED", "EXIT_SIGPIPE", "EXIT_UNREADABLE", "EXIT_USAGE", "_VisibleFormatter", "exit_code",
           "main"]
