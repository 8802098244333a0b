"""VFX plates in: 10- and 12-bit TIFF and DPX, decoded at full precision by OpenImageIO.

OpenCV's TIFF decoder reads 8-, 16- and 32-bit samples only, and has no DPX
reader at all; OpenImageIO (the ASWF's image library, the `plates` extra:
about 20 MB installed, so not in the daemon's core install) reads every bit
depth libtiff does and DPX's packings. It is imported only when such a plate
is met; without it `decode` says in one line what to install.

A DPX's layout is checked from its own header first (`formats.dpx_layout`):
the size against the megapixel limit, the packing and descriptor against
what is known to decode right, and the data's length against the file's,
so a plate still being copied is never decoded as if it were whole.

All the bits are read (into 16 bits, scaled to the full range), then the
picture is rounded to the 8 bits the model takes, as a 16-bit PNG's is.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from types import ModuleType

import numpy as np

from depthwatch.errors import FrameError

INSTALL = "pip install 'depthwatch[plates]'"


@functools.lru_cache(maxsize=1)
def _oiio() -> ModuleType:
    try:
        import OpenImageIO
    except ImportError:
        raise FrameError(f"10- and 12-bit TIFF and DPX plates need OpenImageIO, which is not installed; run: {INSTALL}") from None
    # The decode runs on the calling worker thread: the workers are the parallelism.
    OpenImageIO.attribute("threads", 1)
    return OpenImageIO


def require() -> None:
    """FrameError (one line, what to install) when OpenImageIO is not there."""
    _oiio()


def decode(data: bytes, fmt: str) -> np.ndarray:
    """The plate as BGR uint8 [H, W, 3]; FrameError (one line) if OpenImageIO cannot read it."""
    oiio = _oiio()
    with _MemoryFile(data) as path:
        image = oiio.ImageInput.open(path)
        if image is None:
            raise FrameError(f"cannot decode the {fmt.upper()} data: {_reason(oiio.geterror())}")
        try:
            spec = image.spec()
            channels = spec.nchannels
            pixels = image.read_image(0, 0, 0, channels, oiio.UINT16)
            if pixels is None or image.has_error or getattr(pixels, "shape", None) != (spec.height, spec.width, channels):
                raise FrameError(f"cannot decode the {fmt.upper()} data: {_reason(image.geterror())}")
        finally:
            image.close()
    if channels >= 3:
        bgr = pixels[:, :, 2::-1]
    else:
        bgr = np.repeat(pixels[:, :, :1], 3, axis=2)
    return ((bgr.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)


def _reason(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:200] if lines else "the file is corrupt"


class _MemoryFile:
    """The bytes as a file OpenImageIO can open by name: an anonymous memory file where there is one.

    OpenImageIO's Python reader takes a file name, and the bytes were read once
    already (the watcher's version of the file): they are what is decoded.
    """

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._fd = -1
        self._temp: str | None = None

    def __enter__(self) -> str:
        if hasattr(os, "memfd_create") and sys.platform.startswith("linux"):
            self._fd = os.memfd_create("depthwatch-plate", os.MFD_CLOEXEC)
            _write_all(self._fd, self._data)
            return f"/proc/self/fd/{self._fd}"
        fd, self._temp = tempfile.mkstemp(prefix=".depthwatch-plate-")
        try:
            _write_all(fd, self._data)
        finally:
            os.close(fd)
        return self._temp

    def __exit__(self, *exc_info: object) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        if self._temp is not None:
            os.unlink(self._temp)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
