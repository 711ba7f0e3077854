"""Which image projector (``mmproj``) a model loads with, and what it costs (issue 38).

In order: the one a ``load`` named (``--mmproj``), the config's ``[mmproj]`` table (a model
name = a path; an empty path: none), else the one beside the model: a ``.gguf`` in the same
folder with "mmproj" in its name (how Hugging Face repositories and LM Studio ship them, a
folder per model): the only one in a folder of one model, else the one whose name holds the
model's (a folder of many models: ``seer.gguf`` and ``mmproj-seer.gguf``), else among those
the one whose ``clip.vision.projection_dim`` is the model's width. A pulled model's record
names the projector pulled with it, which comes before all of these (several quantisations
of one repository share a folder and its one projector). Pure: file names, pull records and
GGUF headers only.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from modeld.errors import ModeldError
from modeld.model.gguf import ProjectorInfo, read_projector_info
from modeld.model.memory import KEPT_BITMAP_BYTES, KEPT_IMAGES
from modeld.pull.names import is_projector_file
from modeld.pull.store import read_record
from modeld.registry import model_stem

if TYPE_CHECKING:
    from pathlib import Path

    from modeld.config import Settings
    from modeld.model.modelinfo import ModelInfo

#: Activations of the vision tower per patch and unit of width (f32 values ggml's graph
#: allocator holds at once), fitted with the fixed cost below to two generated projectors.
_ACTIVATIONS_PER_PATCH = 3
#: What libmtmd's context costs whatever the projector. Measured on CPU (a runner's load
#: footprint with the projector minus without, after mtmd's warm-up encode): a 0.1 MiB
#: projector +3.3 MiB anonymous; a 13.2 MiB one (224 px, 256 patches, width 256) +17.4 MiB,
#: charged 19.8 MiB by this formula.
CONTEXT_BYTES = 3 * 1024 * 1024
#: Headers read, by (path, size, mtime): the daemon asks for a vision model's projector at
#: every request, and reading its header took ~4 ms of a 60 ms image turn.
_HEADERS: dict[tuple[str, int, int], ProjectorInfo] = {}


def beside(model: Path, width: int) -> str | None:
    """The projector in the model's folder, when exactly one fits (see the module's doc)."""
    folder = model.parent
    try:
        ggufs = [n for n in os.listdir(folder) if n.lower().endswith(".gguf")]
    except OSError:
        return None
    pulled = (read_record(model) or {}).get("mmproj")  # pulled with the model: its own
    if isinstance(pulled, str) and pulled in ggufs and is_projector_file(pulled):
        return str(folder / pulled)
    names = sorted(n for n in ggufs if is_projector_file(n) and n != model.name)
    if not names:
        return None
    alone = len(ggufs) - len(names) == 1  # the model's own folder (a pulled repository)
    if len(names) == 1 and alone:
        return str(folder / names[0])
    stem = model_stem(model).lower().split("-q")[0]
    named = [n for n in names if stem and stem in n.lower()]
    if len(named) == 1:
        return str(folder / named[0])
    fitting = []
    for n in named or (names if alone else []):
        try:
            if _read(str(folder / n)).projection_dim == width:
                fitting.append(n)
        except ModeldError:
            continue
    return str(folder / fitting[0]) if len(fitting) == 1 else None


def find(model: Path, info: ModelInfo, name: str, settings: Settings,
         asked: str | None = None) -> ProjectorInfo | None:
    """The projector ``model`` (called ``name``) loads with, read; None: a text-only model.
    A named projector that cannot be read is an error (it names the file)."""
    if asked is None:
        asked = settings.mmproj.get(name, settings.mmproj.get(str(model)))
    if asked is None:
        asked = beside(model, info.embedding_length)
    if not asked:
        return None
    return _read(os.path.expanduser(asked))


def _read(path: str) -> ProjectorInfo:
    """:func:`read_projector_info`, read again only when the file changed."""
    try:
        st = os.stat(path)
    except OSError:
        return read_projector_info(path)  # its error names the file and says what to do
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _HEADERS:
        if len(_HEADERS) >= 64:
            _HEADERS.clear()
        _HEADERS[key] = read_projector_info(path)
    return _HEADERS[key]


def memory_bytes(p: ProjectorInfo, text_width: int) -> int:
    """What a projector adds to its runner: its weights (read into memory, not mapped), the
    vision tower's compute for one image, the image's preprocessed pixels, and the embeddings
    of the images kept for reuse, and the decoded images kept (measured:
    :data:`CONTEXT_BYTES`)."""
    patches = (p.image_size // p.patch_size) ** 2 if p.patch_size else 0
    activations = patches * (_ACTIVATIONS_PER_PATCH * p.embedding_length
                             + 2 * p.feed_forward_length) * 4  # fmt: skip
    pixels = 3 * p.image_size * p.image_size * 4
    embeddings = (KEPT_IMAGES + 1) * patches * text_width * 4
    return CONTEXT_BYTES + KEPT_BITMAP_BYTES + p.tensor_bytes + activations + pixels + embeddings
