"""Optional libraries called without their chatter: torchao's kernels that cannot load on a CPU and the
deprecation notices its import sets off in torch, transformers' progress bars and its advice to install
sacremoses. Silenced only inside ``quiet_libraries()``, where the project imports or loads through them;
their errors, and every other warning of the program, are left as they are."""

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator

LOGGERS = ("torchao", "torch.utils._pytree", "transformers")  # raised to ERROR inside
WARNINGS = ("Recommended: pip install sacremoses",)  # a Marian tokenizer's, for languages we do not split


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in LOGGERS]
    levels = [logger.level for logger in loggers]
    bars = _progress_bars(False)
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            for message in WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        _progress_bars(bars)


def _progress_bars(enabled: bool | None) -> bool | None:
    """Turn transformers' progress bars on or off (None: leave them) and say what they were; None when
    transformers is not loaded yet (a quiet block imports it, and the next one loads through it)."""
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is None or enabled is None:
        return None
    before = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    return before
