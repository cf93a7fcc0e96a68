"""The one error type the CLI turns into a single line and a non-zero exit."""


class SlabtuneError(Exception):
    """Bad input or an unusable environment; ``str(err)`` is the whole user-facing line and
    should name the offending field, file or value."""
