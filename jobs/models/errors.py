"""(jobs/models) The one error a model reference or load raises: its message is for people."""


class ModelError(RuntimeError):
    """A model that cannot be found or loaded; the message says what to do."""
