"""Where in the user's code a term was built, so that errors can point there.

The location is the innermost stack frame outside the cortado package: the line the user wrote,
not the line of cortado that happened to build the term on their behalf.
"""

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_location():
    """``(filename, lineno)`` of the nearest caller outside cortado, or None at top level."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    return (frame.f_code.co_filename, frame.f_lineno)


def format_location(location):
    if location is None:
        return "<unknown>"
    filename, lineno = location
    try:
        filename = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        pass
    return f"{filename}:{lineno}"
