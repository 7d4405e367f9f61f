"""Builds specialised to the input shapes a session is called with, made when a shape recurs.

A model with symbolic input dims compiles to symbolic kernels: no loop over a symbolic dim can be tiled
or unrolled for its size, and `claim_policy='auto'` can only judge its partitions at invented sizes.
Measured on the corpus: YOLOv8n (height, width symbolic) ran 9.8 ms on TVM against onnxruntime's 5.4 ms,
so the default left it all to onnxruntime; built at 320 x 320 it ran 3.9 ms. So where calls keep coming
with the same shapes, the session compiles the model again with those shapes fixed (a session of its
own: its claims, measurements and compile cache entries are those of a static model) and hands those
calls to it, as onnxruntime's TensorRT EP builds an engine for a shape it first sees.

A build happens on the `SPECIALISE_AFTER`th call with the same shapes, in that call (seconds, once; a
compile cache makes it a load), for at most `limit` shapes per session (`nxrt.shape_specialisations`):
a shape seen once or twice (a server's odd request) costs nothing, and shapes that never repeat
cannot make a session compile without end. A build that brings no TVM partition (every partition
measured slower on TVM at those shapes too) is dropped: the session's own plan serves those shapes.

A session that defers its symbolic plan (`nxrt.symbolic_compile`, the default where claims are judged
by speed) runs on onnxruntime alone until shapes recur, and builds the symbolic plan (`general`) only
once calls have brought `SPECIALISE_AFTER` shapes it holds no build for: shapes that vary.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["SPECIALISE_AFTER", "ShapeSpecialiser", "Shapes"]

log = logging.getLogger(__name__)

#: calls with the same input shapes before the session builds for them (the third: a shape that recurs)
SPECIALISE_AFTER = 3
#: distinct shapes counted before counting stops (a stream of ever-new shapes keeps no growing table)
_MAX_COUNTED = 1024

Shapes = tuple[tuple[int, ...], ...]
S = TypeVar("S")


class ShapeSpecialiser(Generic[S]):
    """Which session serves a call's input shapes: a specialised one, made by `build` (None: no gain at
    those shapes), on the `SPECIALISE_AFTER`th call with them, for at most `limit` shapes; else the one
    `general` makes (once, when shapes vary), where the session defers its symbolic plan."""

    def __init__(
        self, build: Callable[[Shapes], S | None], limit: int, general: Callable[[], S | None] | None = None
    ):
        self._build = build
        self.limit = limit
        #: shapes -> the session built for them
        self.sessions: dict[Shapes, S] = {}
        #: the symbolic plan's session, once `general` made it (None: the session's own plan serves)
        self.general: S | None = None
        self._make_general = general
        self._seen: dict[Shapes, int] = {}  # shapes not built for -> calls with them
        self._settled: set[Shapes] = set()  # built, or tried: never built again
        self._lock = threading.Lock()

    def settled(self, shapes: Shapes) -> bool:
        """Whether calls with `shapes` stay with the session's own plan for good: a build was tried for
        them and dropped, and no general session exists (`session_for` would count nothing)."""
        return shapes in self._settled and self.general is None and shapes not in self.sessions

    def session_for(self, shapes: Shapes) -> S | None:
        """The session for `shapes`: built for them (on the call that makes them recur), else the general
        one; None: the session's own plan serves them."""
        session = self.sessions.get(shapes)
        if session is not None:
            return session
        if self._make_general is None and (shapes in self._settled or len(self._settled) >= self.limit):
            return self.general
        with self._lock:  # concurrent runs count once each, and one of them builds
            session = self.sessions.get(shapes)
            if session is not None:
                return session
            seen = self._seen.pop(shapes, 0) + 1
            if shapes not in self._settled:
                if seen >= SPECIALISE_AFTER and len(self._settled) < self.limit:
                    self._settled.add(shapes)
                    session = self._build(shapes)
                    if session is not None:
                        self.sessions[shapes] = session
                        return session
                elif len(self._seen) < _MAX_COUNTED:
                    self._seen[shapes] = seen
            if self._make_general is not None and len(self._seen) >= SPECIALISE_AFTER:
                make, self._make_general = self._make_general, None  # tried once
                self.general = make()
            return self.general
