"""The distribution that installs tierproxy, as the one-line errors and the docs name it."""

# on PyPI: `pip install kafka-tierproxy`; the command and the import package stay `tierproxy` (the name `tierproxy`
# on PyPI is another party's)
DISTRIBUTION = "kafka-tierproxy"


def pip_install(extra: str) -> str:
    """The command that installs this distribution with `extra`."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"
