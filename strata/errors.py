"""Exceptions shared by every Strata module.

Must not import anything from strata: every module may import it.
"""


class StrataError(Exception):
    """Base class of Strata's own errors."""


class StrataFormatError(StrataError):
    """A model file is malformed or not what Strata expects; the message names file and field."""


class StrataArgumentError(StrataError, ValueError):
    """An argument of a call or a command is out of range; the message names it, what was expected
    and what was found. A ValueError too, so callers catching ValueError keep working."""


class NativeError(StrataError):
    """The native runtime refused a call; the message names the call and the reason."""


class SlowPathWarning(UserWarning):
    """A configuration that works but will be much slower than a user would expect (experts read
    mostly from the disk); said once, at start. The CLI prints it as one `strata: warning:` line."""


class ContextWarning(UserWarning):
    """A context longer than the model was trained for (llama.cpp warns too): it runs, but positions
    past the trained length are out of the model's experience. The CLI prints one `strata: warning:` line."""
