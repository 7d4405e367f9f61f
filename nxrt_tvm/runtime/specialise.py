"""Builds specialised to the input shapes a session is called with, made when a shape recurs; and to the
values of the inputs that decide a branch (`graph.constants.branch_inputs`), made when a value recurs.

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

An input whose value alone decides an ``If`` (Silero VAD's ``sr``: its whole network sits in the two
branches of ``If(sr == 16000)``) keeps every claim away from the network: no EP compiles through control
flow. Its value joins the shapes in a call's signature, and the build for a signature has the input
fixed to that value, so the branch taken is folded in and the network is claimed whole (Silero VAD:
one TVM partition, 0.5x onnxruntime's time, where the model ran all on onnxruntime before). A call with
another value is another signature: its own build, or the session's own plan.

A session that defers its symbolic plan (`nxrt.symbolic_compile`, the default where claims are judged
by speed) runs on onnxruntime alone until shapes recur, and builds the symbolic plan (`general`) only
once calls have brought `SPECIALISE_AFTER` shapes it holds no build for: shapes that vary.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["SPECIALISE_AFTER", "ShapeSpecialiser", "Signature"]

log = logging.getLogger(__name__)

#: calls with the same input shapes before the session builds for them (the third: a shape that recurs)
SPECIALISE_AFTER = 3
#: distinct shapes counted before counting stops (a stream of ever-new shapes keeps no growing table)
_MAX_COUNTED = 1024

#: what a build is for: the calls' input shapes, then the values of their branch inputs
Signature = tuple[Hashable, ...]
S = TypeVar("S")


class ShapeSpecialiser(Generic[S]):
    """Which session serves a call's signature: a specialised one, made by `build` (None: no gain for
    it), on the `SPECIALISE_AFTER`th call with it, for at most `limit` signatures; else the one `general`
    makes (once, when signatures vary), where the session defers its symbolic plan."""

    def __init__(
        self,
        build: Callable[[Signature], S | None],
        limit: int,
        general: Callable[[], S | None] | None = None,
    ):
        self._build = build
        self.limit = limit
        #: signature -> the session built for it
        self.sessions: dict[Signature, S] = {}
        #: the symbolic plan's session, once `general` made it (None: the session's own plan serves)
        self.general: S | None = None
        self._make_general = general
        self._seen: dict[Signature, int] = {}  # signatures not built for -> calls with each
        self._settled: set[Signature] = set()  # built, or tried: never built again
        self._lock = threading.Lock()

    def settled(self, signature: Signature) -> bool:
        """Whether calls with `signature` stay with the session's own plan for good: a build was tried for
        it and dropped, and no general session exists (`session_for` would count nothing)."""
        return signature in self._settled and self.general is None and signature not in self.sessions

    def session_for(self, signature: Signature) -> S | None:
        """The session for `signature`: built for it (on the call that makes it recur), else the general
        one; None: the session's own plan serves it."""
        session = self.sessions.get(signature)
        if session is not None:
            return session
        if self._make_general is None and (signature in self._settled or len(self._settled) >= self.limit):
            return self.general
        with self._lock:  # concurrent runs count once each, and one of them builds
            session = self.sessions.get(signature)
            if session is not None:
                return session
            seen = self._seen.pop(signature, 0) + 1
            if signature not in self._settled:
                if seen >= SPECIALISE_AFTER and len(self._settled) < self.limit:
                    self._settled.add(signature)
                    session = self._build(signature)
                    if session is not None:
                        self.sessions[signature] = session
                        return session
                elif len(self._seen) < _MAX_COUNTED:
                    self._seen[signature] = seen
            if self._make_general is not None and len(self._seen) >= SPECIALISE_AFTER:
                make, self._make_general = self._make_general, None  # tried once
                self.general = make()
            return self.general
