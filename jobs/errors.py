"""The error a refused job config raises, below the spec and its YAML loader so both can raise it."""


class SpecError(ValueError):
    """A refused job config. ``key`` names the offending field (None for the whole file)."""

    def __init__(self, key: str | None, message: str):
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)
