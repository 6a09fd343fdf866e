"""cuDNN's own log, routed into Python's :mod:`logging` (off by default).

cuDNN 9 reports each API call (info), what it warns about and the traceback of each failed call (error) to a
callback set with ``cudnnSetCallback``; without one it writes them where ``CUDNN_LOGDEST_DBG`` says, at the level
``CUDNN_LOGLEVEL_DBG`` sets (both read when the library loads; unset, nothing is logged). :func:`enable_cudnn_logging`
installs a callback that forwards each message to the ``cudnnkit.cudnn`` logger (a child of ``cudnnkit``: the
handlers and level set on ``cudnnkit`` apply), with cuDNN's severity as the record's level;
:func:`disable_cudnn_logging` puts back what was set before. Neither needs a GPU or the environment variables:
host-only calls log too (``cudnnSetTensor4dDescriptor`` with a bad argument logs an error).

Measured on cuDNN 9.19: a mask keeps no fatal bit and always gets the error bit (``cudnnSetCallback(0, ...)`` sets ``CUDNN_SEV_ERROR_EN``)
and the info bit brings the warning bit, so the mask of a fresh process (0: nothing logged) cannot be set again.
Disabling from that state therefore keeps cudnnkit's callback installed, muted (the error bit only, each message
dropped): cuDNN's default callback would print every failed call, refusals that cudnnkit handles included, to
stderr. A callback or a ``CUDNN_LOGLEVEL_DBG`` mask that was there before is put back as it was.

=====================  ========================  ====================================
cuDNN severity         mask bit                  :mod:`logging` level of the record
=====================  ========================  ====================================
``CUDNN_SEV_FATAL``    ``1 << 0`` (dropped)      ``CRITICAL``
``CUDNN_SEV_ERROR``    ``CUDNN_SEV_ERROR_EN``    ``ERROR``
``CUDNN_SEV_WARNING``  ``CUDNN_SEV_WARNING_EN``  ``WARNING``
``CUDNN_SEV_INFO``     ``CUDNN_SEV_INFO_EN``     ``INFO`` (one record per cuDNN call)
=====================  ========================  ====================================
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from .. import lib

__all__ = ["enable_cudnn_logging", "disable_cudnn_logging", "cudnn_logging_enabled", "LOGGER_NAME"]

#: the logger cuDNN's messages go to (a child of ``cudnnkit``)
LOGGER_NAME = "cudnnkit.cudnn"
_logger = logging.getLogger(LOGGER_NAME)

#: cudnnSeverity_t -> logging level
_LEVELS = {0: logging.CRITICAL, 1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO}
_FATAL_EN = 1 << 0  # cuDNN names no macro for it: the mask's bits follow cudnnSeverity_t
_NAMES = {"fatal": logging.CRITICAL, "critical": logging.CRITICAL, "error": logging.ERROR,
          "warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}  # fmt: skip

# The message argument as a raw pointer: cuDNN's message is several NUL-terminated lines ending with an empty one,
# which lib.cudnnCallback_t's c_char_p would cut at the first line. Cast to lib.cudnnCallback_t to install.
_RawCallback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(lib.cudnnDebug_t), ctypes.c_void_p)

_lock = threading.Lock()
#: while enabled: the mask, udata and fptr set before, which disabling restores
_previous: tuple[int, Any, Any] | None = None
#: whether the callback forwards (False: installed but muted, see the module docstring)
_forwarding = False
#: the least record level forwarded: cuDNN adds bits to a mask (the error bit always), so the callback filters too
_min_level = logging.WARNING


def _level(level: int | str) -> int:
    """``level`` as a :mod:`logging` level (``ValueError``/``TypeError`` naming ``level``)."""
    if isinstance(level, str):
        if level.lower() not in _NAMES:
            raise ValueError(f"level must be a logging level or one of {sorted(_NAMES)}, got {level!r}")
        level = _NAMES[level.lower()]
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"level must be a logging level (int) or its name, got {type(level).__name__}")
    return level


def _mask(level: int) -> int:
    """The ``cudnnSetCallback`` mask that asks for ``level`` (a :mod:`logging` level) and the more severe
    messages."""
    mask = _FATAL_EN
    if level <= logging.ERROR:
        mask |= lib.CUDNN_SEV_ERROR_EN
    if level <= logging.WARNING:
        mask |= lib.CUDNN_SEV_WARNING_EN
    if level <= logging.INFO:
        mask |= lib.CUDNN_SEV_INFO_EN
    return mask


def _lines(msg: int | None) -> str:
    """cuDNN's message at ``msg``: NUL-separated lines up to an empty one, joined with newlines."""
    if not msg:
        return ""
    lines = []
    while len(lines) < 10_000:  # a bound, should a message ever lack its terminator
        line = ctypes.string_at(msg)
        if not line:
            break
        lines.append(line.decode("utf-8", "replace"))
        msg += len(line) + 1
    return "\n".join(lines)


def _forward(sev: int, udata: Any, dbg: Any, msg: int | None) -> None:
    """The callback: one record on the ``cudnnkit.cudnn`` logger per message. It must not raise (ctypes would
    print the exception and return to cuDNN), so any error in it is reported through logging's own handler."""
    try:
        level = _LEVELS.get(sev, logging.ERROR)
        if not _forwarding or level < _min_level or not _logger.isEnabledFor(level):
            return
        extra = {"cudnn_severity": sev}
        if dbg:
            d = dbg.contents
            extra.update(cudnn_status=d.cudnnStatus, cudnn_handle=d.handle, cudnn_stream=d.stream)
        _logger.log(level, "%s", _lines(msg), extra=extra)
    except Exception:  # noqa: BLE001  (nothing may propagate into cuDNN)
        logging.getLogger("cudnnkit").exception("forwarding a cuDNN log message failed")


#: the installed callback: made once and never freed (cuDNN holds only its address, and a call on another thread
#: may be inside it while logging is disabled), cast to the binding's type
_RAW_CALLBACK = _RawCallback(_forward)
_CALLBACK = ctypes.cast(_RAW_CALLBACK, lib.cudnnCallback_t)


def _address(f: Any) -> int | None:
    return ctypes.cast(f, ctypes.c_void_p).value


def enable_cudnn_logging(level: int | str = logging.WARNING) -> None:
    """Route cuDNN's own log into the ``cudnnkit.cudnn`` logger, from ``level`` up.

    Installs a callback with ``cudnnSetCallback`` (the mask asks cuDNN only for the severities at or above
    ``level``); each message becomes one record whose level is cuDNN's severity (fatal: ``CRITICAL``, error:
    ``ERROR``, warning: ``WARNING``, info: ``INFO``) and whose text is cuDNN's lines (the call, its arguments, the
    error traceback, time, process, thread, GPU, handle and stream). The record carries ``cudnn_severity``,
    ``cudnn_status``, ``cudnn_handle`` and ``cudnn_stream`` attributes. Calling it again changes the level;
    :func:`disable_cudnn_logging` restores what was set before the first call. Process-wide (cuDNN has one
    callback); needs no GPU, and no ``CUDNN_LOGLEVEL_DBG``/``CUDNN_LOGDEST_DBG``.

    Args:
        level: a :mod:`logging` level (``logging.INFO`` asks for every cuDNN call: a record per call, which slows
            the host side down) or its name, ``"fatal"``/``"critical"``, ``"error"``, ``"warning"``, ``"info"``
            or ``"debug"`` (as ``"info"``: cuDNN has no lower severity).

    Returns:
        None.

    Raises:
        ValueError: an unknown level name.
        TypeError: ``level`` is neither an int nor a str.
        cudnnkit.lib.errors.CudnnError: ``cudnnGetCallback`` or ``cudnnSetCallback`` failed.

    Example:
        >>> import logging
        >>> from cudnnkit import runtime
        >>> logging.basicConfig()
        >>> runtime.enable_cudnn_logging("error")   # each failed cuDNN call's traceback, at ERROR
        >>> runtime.disable_cudnn_logging()
    """
    global _previous, _forwarding, _min_level
    level = _level(level)
    mask = _mask(level)
    with _lock:
        previous = _previous
        if previous is None:
            m, u, f = ctypes.c_uint(), ctypes.c_void_p(), lib.cudnnCallback_t()
            lib.cudnnGetCallback(ctypes.byref(m), ctypes.byref(u), ctypes.byref(f))
            # cudnnkit's muted callback stands for a fresh process's state (mask 0), which cuDNN cannot set again
            previous = (0, None, lib.cudnnCallback_t()) if _address(f) == _address(_CALLBACK) else (m.value, u.value, f)
        _min_level = max(level, logging.INFO)  # "debug" is "info": cuDNN has nothing below
        lib.cudnnSetCallback(mask, None, _CALLBACK)
        _previous, _forwarding = previous, True


def disable_cudnn_logging() -> None:
    """Stop routing cuDNN's log: put back the callback, mask and user data from before
    :func:`enable_cudnn_logging` (cuDNN's own callback, which writes where ``CUDNN_LOGDEST_DBG`` says, at the
    ``CUDNN_LOGLEVEL_DBG`` mask). From a fresh process's state (mask 0, which cuDNN 9.19 cannot set again) the
    callback stays installed with the error bit only and drops every message, so nothing is printed, as before.
    Does nothing when it is not enabled.

    Returns:
        None.

    Raises:
        cudnnkit.lib.errors.CudnnError: ``cudnnSetCallback`` failed.

    Example:
        >>> runtime.disable_cudnn_logging()
    """
    global _previous, _forwarding
    with _lock:
        if _previous is None:
            return
        mask, udata, fptr = _previous
        _forwarding = False
        if mask == 0 and not _address(fptr):
            lib.cudnnSetCallback(lib.CUDNN_SEV_ERROR_EN, None, _CALLBACK)  # muted: see the module docstring
        else:
            lib.cudnnSetCallback(mask, udata, fptr)
        _previous = None


def cudnn_logging_enabled() -> bool:
    """Whether :func:`enable_cudnn_logging` routes cuDNN's log now."""
    return _forwarding
