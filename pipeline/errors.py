"""The one base class of the errors the command line reports in one line, not as a stack trace: bad input
(config, data, a bundle, a checkpoint) and a missed export gate. Each module defines its own subclass."""


class PipelineError(Exception):
    """Raised with a message that names the file, key or example at fault."""
