"""Errors shared by all stages."""


class UserError(Exception):
    """An error caused by the user's input: printed as one clear message, exit status 2."""
