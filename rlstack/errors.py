"""The base of every error rlstack reports as a message (what, where, how to fix) rather than a traceback."""


class RLStackError(Exception):
    """A user-facing problem: bad config, data, model path, reward function, or a diverged run."""


class TrainingDiverged(RLStackError, RuntimeError):
    """A loss, gradient, weight or logit that is NaN or infinite; nothing after it is applied or saved."""


class OutOfMemory(RLStackError, RuntimeError):
    """A device ran out of memory; the message names the pass, its size and the settings that bound it."""
