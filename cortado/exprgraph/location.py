"""Where in the user's code a term was built, so that errors can point there.

The location is the innermost stack frame outside the cortado package: the line the user wrote,
not the line of cortado that happened to build the term on their behalf.
"""

import os
import sys
import sysconfig

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARY_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "purelib", "platlib")})


def user_location():
    """``(filename, lineno)`` of the nearest caller outside cortado, or None at top level."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    return (frame.f_code.co_filename, frame.f_lineno)


def called_by_user():
    """Whether the calling function was called by the user, not by cortado building terms for the user (a rule's
    ``ct.take``): the first frame outside the caller's own module (a public function and its wrappers) is the user's."""
    frame = sys._getframe(1)
    module = frame.f_code.co_filename
    while frame is not None and frame.f_code.co_filename == module:
        frame = frame.f_back
    return frame is None or not frame.f_code.co_filename.startswith(_PACKAGE_DIR)


def user_call_chain(depth=2):
    """``file:line`` of the nearest caller outside cortado and, up to ``depth`` in all, of the user code that
    called it (not Python's or an installed library's, such as a test runner's): a helper's line alone
    cannot tell its two calls apart."""
    frame = sys._getframe(1)
    lines = []
    while frame is not None and len(lines) < depth:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE_DIR) and not (lines and filename.startswith(_LIBRARY_DIRS)):
            lines.append(format_location((filename, frame.f_lineno)))
        frame = frame.f_back
    if not lines:
        return "<unknown>"
    return lines[0] + "".join(f" (called from {line})" for line in lines[1:])


def format_location(location):
    if location is None:
        return "<unknown>"
    filename, lineno = location
    try:
        filename = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        pass
    return f"{filename}:{lineno}"
