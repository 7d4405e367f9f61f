"""The register-tiled contraction schedule shared by the matmul, convolution and pooling rules.

One reduction block ``out[s..., i, ..., j] = reduce(r...)`` whose output is
indexed last by the spatial iterator ``j``: ``j`` is vectorised over the host
vector width (two vectors per tile), a row axis ``i`` that the ``j``-dependent
operand does not use is unrolled ``TILE_I`` times (so each loaded vector feeds
``TILE_I`` FMAs), the tile accumulates in registers (``cache_write`` to
``local``), producers (padding, transposes) are inlined, the epilogue (bias,
activation, residual) is inlined into the write-back, and the outer tile
loops are fused and run in parallel.

Where the ``j``-operand is a constant weight (a *layout-free* buffer: TVM's
`AttachAttrLayoutFreeBuffers` marks it) indexed ``W[r..., j]`` (matmul
``B[k, j]``, NHWC convolution ``W[kh, kw, ic, oc]``), it is packed at compile
time into ``[J / tile, r..., tile]`` panels, one per column tile, and the
column tiles become the outermost loop: each thread streams one contiguous
panel, kept in cache for every row tile, instead of two vectors from rows
``4 * J`` bytes apart. The packing is a layout-rewrite block that
`SplitLayoutRewritePreproc` moves out of the kernel and `FoldConstant`
evaluates on the weight, as for MetaSchedule's own layout rewrites: it costs
nothing at run time.

``i`` and ``j`` extents the tile does not divide (a symbolic sequence, ViT's
197 patches) are padded to whole tiles (`pad_einsum`), so the register tile
stays static and unpredicated; the epilogue writes only the real elements.
A convolution, which `pad_einsum` cannot pad, whose rows of pixels no row tile
divides (7 or 14 in AVX2's 6-row tiles) tiles its image's pixels as one axis
instead (`_pixel_rows`): one ragged tile per image, not one per row.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import ir, s_tir, sym, tirx
from tvm.s_tir.dlight.analysis import collect_block_iter_vars_used_in_access_region

from .base import extent_of, parallel, parallel_vectorize, uses_div_mod, vector_lanes, vector_registers

__all__ = [
    "ContractionShape",
    "DotProduct",
    "contraction_shape",
    "tile_contraction",
    "tile_rows",
    "LAYOUT_REWRITE",
]

#: the block annotation `relax.transform.SplitLayoutRewritePreproc` moves out of a kernel
LAYOUT_REWRITE = "meta_schedule.layout_rewrite_preproc"

TILE_I = 8  #: rows of the register tile, at most
VECTORS_J = 2  #: vectors per row of the register tile


def tile_rows(target) -> int:
    """Rows of the register tile on `target`: its accumulators (rows x `VECTORS_J`), the j-operand's
    vectors and the broadcast row value must fit in the vector registers. 8 x 2 with AVX-512's 32;
    6 x 2 with AVX2's 16 (8 x 2 spilled there: ResNet-18 ran 1.3x onnxruntime on a Zen 3, 6 x 2
    0.76x, the 1024^3 GEMM 1.07x instead of 1.7x)."""
    return min(TILE_I, (vector_registers(target) - VECTORS_J - 1) // VECTORS_J)


@dataclass(frozen=True)
class DotProduct:
    """A tensor intrinsic that computes one vector of the register tile over `depth` terms of the
    reduction at once (AVX-512 VNNI: 16 int32 lanes, each the sum of 4 uint8 x int8 products)."""

    intrin: str  #: its `s_tir.TensorIntrin` name
    lanes: int  #: output lanes a call computes
    depth: int  #: reduction terms each lane sums in a call


class ContractionShape:
    """Where the one reduction block of a function sits, and the axes to tile."""

    def __init__(
        self,
        block,
        block_index: int,
        spatial: int,
        reduce: int,
        i_axis: int | None,
        outer_rows: bool = False,
        depthwise: bool = False,
    ):
        self.block = block
        self.block_index = block_index
        self.spatial = spatial  # leading S iterators
        self.reduce = reduce  # trailing R iterators
        self.i_axis = i_axis  # spatial iterator to unroll as tile rows (None: one row)
        #: the iterator just outside `i_axis` is rows too (no j-dependent read uses it): a conv's height
        self.outer_rows = outer_rows
        #: every operand is read per output column (a depthwise convolution): none is broadcast across
        #: the tile's columns, so no row axis shares one (a single pixel's convolution is not so: a GEMV)
        self.depthwise = depthwise


def contraction_shape(sch: s_tir.Schedule, blocks: list) -> ContractionShape | None:
    """The contraction in `blocks` (normalised SBlockInfos), or None unless there is exactly one.

    Every other block must be injective; the reduction block's iterators must be
    ``S...S R...R`` and its output's last index its last spatial iterator.
    """
    reductions = [k for k, info in enumerate(blocks) if not info.is_injective()]
    if len(reductions) != 1:
        return None
    index = reductions[0]
    info = blocks[index]
    kinds = info.dom_kind()
    spatial = len(kinds) - len(kinds.lstrip("S"))
    if spatial == 0 or kinds[spatial:] != "R" * (len(kinds) - spatial):
        return None
    stmt = sch.get(info.block_rv)
    if len(stmt.writes) != 1:
        return None
    j_var = stmt.iter_vars[spatial - 1].var
    last = stmt.writes[0].region[-1].min
    if not last.same_as(j_var) or uses_div_mod(sch, info.block_rv, spatial - 1):
        return None
    # i: a spatial iterator that no j-dependent read uses (matmul: M; NCHW conv: output channels).
    j_reads = []
    for region in stmt.reads:
        used = collect_block_iter_vars_used_in_access_region(stmt, region.region)
        if any(v.same_as(j_var) for v in used):
            j_reads.append(used)
    # The innermost such axis that is not of extent 1 (an Nx1 conv's width: no rows to tile), unless it
    # is symbolic and ragged and an outer one is whole tiles: a seq-first torch export's [16, batch, 64]
    # dense layer padded its batch of 1 to 8 rows (5x the work) where the 16 positions tile exactly.
    rows = [
        k
        for k in range(spatial - 2, -1, -1)
        if all(not any(v.same_as(stmt.iter_vars[k].var) for v in used) for used in j_reads)
        and not _is_unit(stmt.iter_vars[k].dom.extent)
    ]
    i_axis = rows[0] if rows else None
    if rows and not isinstance(stmt.iter_vars[rows[0]].dom.extent, tirx.IntImm):
        i_axis = next((k for k in rows if _whole_rows(stmt.iter_vars[k].dom.extent)), rows[0])
        if _batch_rows(stmt.iter_vars[i_axis].dom.extent, i_axis):
            i_axis = None
    outer_rows = i_axis is not None and i_axis - 1 in rows
    depthwise = len(j_reads) == len(stmt.reads)
    return ContractionShape(
        info.block_rv, index, spatial, len(kinds) - spatial, i_axis, outer_rows, depthwise
    )


def _batch_rows(extent: tirx.Expr, axis: int) -> bool:
    """Whether the row axis is a model's batch: the leading axis, a symbolic dim of its own that the tile
    does not provably divide. It stays a loop around one-row tiles, not rows padded to a whole tile: at
    batch 1, the common inference case, 8 padded rows did 8x the work (MobileNetV3's classifier, a
    [batch, 1024] x [1024, 1000] dense layer: 106 us, against 42 us built for batch 1)."""
    return axis == 0 and isinstance(extent, tirx.Var) and _ragged(extent, TILE_I)


def _is_unit(extent: tirx.Expr) -> bool:
    return isinstance(extent, tirx.IntImm) and extent.value == 1


def _whole_rows(extent: tirx.Expr) -> bool:
    """Whether tiles of at least half `TILE_I` rows cover `extent` without padding (BERT's 2 heads do
    not: padded sequence rows beat tiles of 2)."""
    if isinstance(extent, tirx.IntImm):
        rows = pick_i_tile(extent.value, TILE_I)
        return rows >= TILE_I // 2 and extent.value % rows == 0
    return not _ragged(extent, TILE_I)


def _filled(extent: int, tile: int) -> float:
    """The share of `extent` padded to whole tiles that is real (500 in tiles of 16: 500 / 512)."""
    return extent / (-(-extent // tile) * tile)


def pick_j_tile(
    extent: int | None, lanes: int, vectors: int, paddable: bool = False, load_bound: bool = False
) -> tuple[int, int]:
    """(tile, vector width) along j: a tile that divides the extent when one fills vectors well.

    Extents such as 7, 14, 28 or 56 (conv widths) get 7-, 14- or 28-wide tiles
    instead of a 32-wide tile with a bounds check, which the vectoriser
    would turn back into scalar code; symbolic or awkward extents get the
    full tile and a checked tail. Where j can be padded (`paddable`: an einsum; a weight is padded as it
    is packed at compile time, an activation by a copy), the full tile padded wins when it fills vectors
    better: 1000 classes ran 10 of 16 lanes in 20-wide tiles (SqueezeNet's last conv 1.9x onnxruntime's),
    1024 padded use them all.
    Where a tile of one vector a row is bound by its loads (`load_bound`: AVX2, a row value loaded for
    every FMA), a dividing tile of fewer vectors counts only its share of the full tile's: a
    [168, 512] x [512, 1000] dense layer on a Zen 3 ran 8-wide tiles 1.7x slower than 16-wide ones
    padded to 1008 columns. AVX-512 tiles are not measured so, and not changed.
    """
    full = (lanes * vectors, lanes)
    if extent is None or extent % full[0] == 0:
        return full
    padded_score = _filled(extent, full[0]) if paddable else 0.0
    best, best_score = full, 0.0
    for tile in range(1, min(extent, lanes * vectors) + 1):
        if extent % tile:
            continue
        vec = next(v for v in range(min(tile, lanes), 0, -1) if tile % v == 0)
        score = tile / (tile // vec * lanes)  # useful lanes per vector register used
        if score > best_score or (score == best_score and tile > best[0]):
            best, best_score = (tile, vec), score
    if paddable and load_bound:
        best_score *= min(1.0, best[0] // best[1] / vectors)
    return best if best_score >= max(0.4, padded_score) else full


def _dot_tile(extent: int | None, lanes: int) -> int:
    """Columns of a dot-product tile: whole vectors of the intrinsic's `lanes` (padded), two a row
    unless one fills a tenth more of them (48 columns: 3 vectors, not 2 x 2)."""
    if extent is None:
        return lanes * VECTORS_J
    return lanes if _filled(extent, lanes) > 1.1 * _filled(extent, lanes * VECTORS_J) else lanes * VECTORS_J


def pick_i_tile(extent: int | None, tile: int, paddable: bool = False) -> int:
    """Rows of the register tile: one that divides the extent when there is one near `tile`.

    A 14-wide conv output split into 8 + 6 rows runs its last tile predicated (the
    unrolled rows all check bounds): 14 and 28 get 7 rows, 56 gets 8. Where the rows can be padded
    (`paddable`: an einsum), the full tile padded wins when it keeps more of its FMAs busy: 128
    sequence rows ran in 4-row tiles on AVX2 (6 rows a tile), Whisper's 500 frames in 5-row ones
    (its attention scores 1.27x slower than in 6-row tiles over 504 padded rows).
    """
    if extent is None:
        return tile
    for rows in range(min(tile, extent), max(tile // 2, 1) - 1, -1):
        if extent % rows == 0:
            if paddable and _filled(extent, tile) > rows / tile:
                return tile
            return rows
    return min(tile, extent)


def _pixel_rows(
    sch: s_tir.Schedule, shape: ContractionShape, loops: list, tile: int, epilogue: list
) -> tuple[int, int, int] | None:
    """Where the rows and the axis outside them should run as one (a convolution's output pixels, not
    one row of them): (the rows' iterator, its index in the output, its extent); else None.
    Where no row tile divides the rows and they cannot be padded: a row of 7 or 14 pixels ran as 6 + 1
    or 6 + 6 + 2 in tiles of 6 (AVX2), 58 % or 78 % of the tile's FMAs doing work; 49 or 196 pixels
    fill 91 % or 99 % of them."""
    if not shape.outer_rows or (epilogue and len(sch.get(epilogue[-1]).iter_vars) != shape.spatial):
        return None
    axis = shape.i_axis
    width, height = extent_of(sch, loops[axis]), extent_of(sch, loops[axis - 1])
    if width is None or height is None or height == 1 or width % pick_i_tile(width, tile) == 0:
        return None
    stmt = sch.get(shape.block)
    index = [r.min for r in stmt.writes[0].region]
    at = next((k for k, e in enumerate(index) if e.same_as(stmt.iter_vars[axis].var)), None)
    if not at or not index[at - 1].same_as(stmt.iter_vars[axis - 1].var):
        return None
    return axis, at, width


def _merged(ndim: int, axis: int, width: int) -> tirx.IndexMap:
    """`ndim` indices with `axis` and the one before merged: ``(.., h, w, ..) -> (.., h * width + w, ..)``."""
    return tirx.IndexMap.from_func(
        lambda *v: (*v[: axis - 1], v[axis - 1] * width + v[axis], *v[axis + 1 :]), ndim=ndim
    )


def _packable_weight(sch: s_tir.Schedule, shape: ContractionShape) -> tirx.Buffer | None:
    """The ``W[b..., r..., j]`` operand when it is a layout-free parameter read by plain iterators
    (or constants): batch iterators ``b`` (batch matmul), then reduction iterators ``r``."""
    func = sch.mod["main"]
    free = func.attrs.get("layout_free_buffers") if func.attrs is not None else None
    if not free:
        return None
    free_buffers = [func.params[int(i)] for i in free]
    stmt = sch.get(shape.block)
    j_var = stmt.iter_vars[shape.spatial - 1].var
    reduce_vars = [iv.var for iv in stmt.iter_vars[shape.spatial :]]
    batch_vars = [iv.var for iv in stmt.iter_vars[: shape.spatial - 1]]
    for region in stmt.reads:
        buffer = region.source
        if not any(buffer.same_as(b) for b in free_buffers):
            continue
        *rows, col = (r.min for r in region.region)
        row_vars = [
            r for r in rows if not isinstance(r, tirx.IntImm)
        ]  # constants: unit axes the analysis folded
        distinct = all(not a.same_as(b) for k, a in enumerate(row_vars) for b in row_vars[k + 1 :])
        # rows: reduction iterators, after any batch iterators (a batch matmul's constant [B, K, N] weight)
        batch = [r for r in row_vars if any(r.same_as(v) for v in batch_vars)]
        reduced = row_vars[len(batch) :]
        if (
            col.same_as(j_var)
            and reduced
            and distinct
            and all(any(r.same_as(v) for v in reduce_vars) for r in reduced)
            and isinstance(buffer.shape[-1], tirx.IntImm)
        ):
            return buffer
    return None


def _pack(sch: s_tir.Schedule, block, weight: tirx.Buffer, tile: int, depth: int = 1) -> None:
    """Read `weight` through a ``[J / tile, r..., tile]`` copy made by a layout-rewrite block (folded at
    compile time): its padded copy where `_pad_to_tiles` padded it, else a new copy. With a `depth`
    (a dot product's terms) the last reduction axis is split too, ``[J / tile, r..., R / depth, tile,
    depth]``: the `depth` terms of each lane lie together, as the intrinsic reads them."""
    reads = sch.get(block).reads
    index = next((k for k, region in enumerate(reads) if region.source.same_as(weight)), None)
    if index is not None:
        packed = sch.cache_read(block, index, "global")
    else:
        packed = next(p for p in sch.get_producers(block) if _reads(sch, p, weight))
        copy = sch.get(packed).writes[0].source
        index = next(k for k, region in enumerate(reads) if region.source.same_as(copy))
    sch.annotate(packed, LAYOUT_REWRITE, True)
    ndim = len(weight.shape)

    def packed_at(*idx):
        if depth == 1:
            return (idx[-1] // tile, *idx[:-1], idx[-1] % tile)
        return (idx[-1] // tile, *idx[:-2], idx[-2] // depth, idx[-1] % tile, idx[-2] % depth)

    sch.transform_layout(block, ("read", index), tirx.IndexMap.from_func(packed_at, ndim=ndim))


def _is_copy(stmt: s_tir.SBlock) -> bool:
    """Whether a block only copies one buffer's element into another (no select, no arithmetic)."""
    return isinstance(stmt.body, tirx.BufferStore) and isinstance(stmt.body.value, ir.TensorLoad)


def _reads(sch: s_tir.Schedule, block, buffer: tirx.Buffer | None) -> bool:
    return buffer is not None and any(region.source.same_as(buffer) for region in sch.get(block).reads)


def _plain_indices(stmt: s_tir.SBlock) -> bool:
    """Whether every operand of `stmt` is indexed by plain iterators or constants: an einsum, which
    `pad_einsum` pads (a convolution's ``h + kh`` is not)."""
    return all(
        isinstance(r.min, (tirx.Var, tirx.IntImm))
        for region in (*stmt.reads, *stmt.writes)
        for r in region.region
    )


def _ragged(extent: tirx.Expr, tile: int) -> bool:
    """Whether a loop `extent`, static or symbolic, is not provably whole tiles. A symbolic multiple of
    the tile (batch x 16 rows) pads nothing: TVM's pad_einsum then adds no copy, and the rule failed (a
    torch export's [batch x 16, 64] dense layer fell to the generic rule's scalar reduction, 5x slower)."""
    return not sym.Analyzer().can_prove(tirx.floormod(extent, tile) == 0)


def _pad_to_tiles(
    sch: s_tir.Schedule,
    block,
    padding: list[int],
    epilogue: list,
    j_axis: int,
    lanes: int,
    weight: tirx.Buffer | None,
    copy_rows: bool = False,
) -> bool:
    """Pad the block's tile axes to whole register tiles (`padding`: 1 where not padded);
    False where the block is not an einsum (a convolution's composite indices): it keeps the split
    with a predicate, which leaves the register tile symbolic (TVM keeps the accumulator as a buffer
    of every row, allocated per tile: a BERT export's dense layers ran 5x slower at sequence 128
    than with the sequence fixed).

    Input elements past the end read as zero: a select on the load, inlined where it is per row; an
    operand padded along the vectorised `j_axis` is copied padded first (a select per lane makes
    TVM scalarise the whole tile: attention scores 10x slower); the padded copy of a packable
    `weight` is left to `_pack`, which makes it the packing. `copy_rows` copies an operand padded
    along the rows too (a tensor intrinsic reads whole buffers, not selects). The copy out is inlined
    into the epilogue (or is the epilogue), which keeps the real domain, so the padding is never written.
    """
    try:
        sch.pad_einsum(block, padding)
    except s_tir.ScheduleError:
        return False
    stmt = sch.get(block)
    j_var = stmt.iter_vars[j_axis].var
    for producer in sch.get_producers(block):
        if not sch.get(producer).name_hint.endswith("_pad") or _reads(sch, producer, weight):
            continue
        padded = sch.get(producer).writes[0].source
        region = next(r for r in stmt.reads if r.source.same_as(padded))
        used = collect_block_iter_vars_used_in_access_region(stmt, region.region)
        if copy_rows or (padding[j_axis] > 1 and any(v.same_as(j_var) for v in used)):
            parallel_vectorize(sch, producer, lanes)
        else:
            sch.compute_inline(producer)
    (copy_out,) = sch.get_consumers(block)
    if epilogue:
        sch.compute_inline(copy_out)
    else:
        epilogue.append(copy_out)
    return True


def tile_contraction(
    sch: s_tir.Schedule,
    blocks: list,
    shape: ContractionShape,
    target,
    inline_producers: bool = True,
    j_major: bool = False,
    dot: DotProduct | None = None,
) -> s_tir.Schedule:
    """Apply the register-tiled schedule (see the module docstring); raises on any schedule error.

    `inline_producers=False` keeps producers (padding) as their own parallel,
    vectorised loops: a padded copy is cheap, bounds checks in the tile are not. A plain copy (a
    convolution's padding of no pixels) is inlined all the same: ResNet-50's 1x1 convs copied their
    whole input first.
    `j_major` puts the column tiles outside the row tiles (a packed weight puts them outermost).
    `dot` computes each vector of the tile with a tensor intrinsic over `dot.depth` reduction terms (the
    reduction's last axis split so, innermost; the weight packed to match, its columns padded to whole
    vectors); the caller sees that the reduction divides.
    """
    block = shape.block
    lanes, tile_i = vector_lanes(target), tile_rows(target)
    weight = _packable_weight(sch, shape)
    for info in blocks[: shape.block_index]:
        if inline_producers or _is_copy(sch.get(info.block_rv)):
            sch.compute_inline(info.block_rv)
        else:
            parallel_vectorize(sch, info.block_rv, lanes)
    # Epilogue: inline its intermediates, keep the block that writes the output. One that broadcasts the
    # result over a larger output (a squeeze-excite's scale times its feature map) is a loop nest of its
    # own after the tile instead: it cannot be the tile's write-back.
    epilogue = [info.block_rv for info in blocks[shape.block_index + 1 :]]
    tail = []
    if epilogue and _grows(sch, block, epilogue[-1]):
        tail, epilogue = epilogue, []
    for rv in epilogue[:-1]:
        sch.compute_inline(rv)

    loops = sch.get_loops(block)
    j_extent = extent_of(sch, loops[shape.spatial - 1])
    # An einsum (which `pad_einsum` pads) pads its tile axes where full tiles use more of the vectors: a
    # constant weight with its packing, at compile time; an operand computed at run time by a copy (its
    # K x N elements, against M x K x N FMAs: Whisper's attention scores over 500 positions ran 10-wide
    # tiles as 5-lane vectors, 1.76x slower). Elsewhere a constant weight keeps a checked column tail
    # (padded, it would be copied at every call) and is not packed (the panels would not tile it).
    paddable = _plain_indices(sch.get(block))
    load_bound = vector_registers(target) < 32
    if dot is None:
        tile_j, vec = pick_j_tile(j_extent, lanes, VECTORS_J, paddable, load_bound)
    else:
        tile_j, vec = _dot_tile(j_extent, dot.lanes), dot.lanes
    pad_j = _ragged(sch.get(loops[shape.spatial - 1]).extent, tile_j)
    if weight is not None and pad_j and not paddable:
        weight, pad_j = None, False
    if tile_j <= lanes:
        tile_i *= 2  # one vector per row: more rows keep enough FMAs in flight
    padding = [1] * len(loops)
    if pad_j:
        padding[shape.spatial - 1] = tile_j
    if shape.i_axis is not None and tile_i > 1:
        i_extent = extent_of(sch, loops[shape.i_axis])
        whole = pick_i_tile(i_extent, tile_i, paddable)
        if i_extent != 1 and _ragged(sch.get(loops[shape.i_axis]).extent, whole):
            padding[shape.i_axis] = whole
    padded = any(p > 1 for p in padding) and _pad_to_tiles(
        sch, block, padding, epilogue, shape.spatial - 1, lanes, weight, copy_rows=dot is not None
    )
    if padded:
        loops = sch.get_loops(block)
    n_spatial, i_axis = shape.spatial, shape.i_axis
    merge = None if padded else _pixel_rows(sch, shape, loops, tile_i, epilogue)
    if merge is not None:  # the rows and the axis outside them as one
        row_axis, out_axis, width = merge
        sch.transform_block_layout(block, _merged(len(loops), row_axis, width))
        loops = sch.get_loops(block)
        n_spatial, i_axis = n_spatial - 1, i_axis - 1
    spatial, reduce = list(loops[:n_spatial]), list(loops[n_spatial:])
    j_outer, j_tile = sch.split(spatial[-1], factors=[None, tile_j])
    j_vec_outer, j_vec = sch.split(j_tile, factors=[None, vec])
    terms = []
    if dot is not None:
        reduce[-1], term = sch.split(reduce[-1], factors=[None, dot.depth])
        terms = [term]
    outer = spatial[:-1]
    rows = []
    if i_axis is not None and tile_i > 1:
        i_loop = outer[i_axis]
        i_extent = extent_of(sch, i_loop)
        if i_extent is None or i_extent > 1:
            i_outer, i_tile = sch.split(i_loop, factors=[None, pick_i_tile(i_extent, tile_i)])
            outer[i_axis] = i_outer
            rows = [i_tile]
    # The tile loops, outermost first; j_major puts the j tiles outside the row tiles, so a
    # K x tile_j panel of the j-operand (matmul weights) stays in cache for every row tile;
    # a packed weight puts them outermost (weights stationary: one panel per run of row tiles).
    tiles = [*outer, j_outer]
    if weight is not None:
        tiles = [j_outer, *outer]
    elif j_major and i_axis is not None:
        tiles = [*outer[:i_axis], j_outer, *outer[i_axis:]]
    sch.reorder(*tiles, *reduce, *rows, j_vec_outer, j_vec, *terms)

    write_back = sch.cache_write(block, 0, "local")
    if padded:
        # The epilogue reads the register tile and is computed under the tile loop over the real
        # (unpadded) domain, which bounds its writes; inlined into the padded write-back it would
        # write the padding past the end of the output.
        sch.compute_inline(write_back)
        write_back = epilogue[-1]
    elif epilogue:
        sch.reverse_compute_inline(epilogue[-1])
    if merge is not None:  # the write-back reads the tile's pixels as the tile wrote them
        # the accumulator and the write-back (which iterates over the output's indices) merge alike
        out_merged = _merged(len(sch.get(block).writes[0].source.shape), out_axis, width)
        sch.transform_layout(block, ("write", 0), out_merged)
        sch.transform_block_layout(write_back, out_merged)
    sch.reverse_compute_at(write_back, tiles[-1], preserve_unit_loops=True)
    wb_loops = sch.get_loops(write_back)[len(tiles) :]
    if wb_loops:
        sch.vectorize(sch.split(wb_loops[-1], factors=[None, vec])[-1])

    parallel(sch, sch.fuse(*tiles))
    for loop in rows:
        sch.unroll(loop)
    sch.unroll(j_vec_outer)
    if dot is None:
        sch.vectorize(j_vec)
    if reduce:
        init = sch.decompose_reduction(block, reduce[0])
        init_loops = sch.get_loops(init)
        sch.vectorize(init_loops[-1])
    if weight is not None:
        _pack(sch, block, weight, tile_j, dot.depth if dot is not None else 1)
    if dot is not None:
        sch.tensorize(j_vec, dot.intrin)
    for rv in tail[:-1]:
        sch.compute_inline(rv)
    if tail:
        parallel_vectorize(sch, tail[-1], lanes)
    return sch


def _grows(sch: s_tir.Schedule, block, last) -> bool:
    """Whether the epilogue's last block writes a larger buffer than the contraction's result."""
    result, output = sch.get(block).writes[0].source.shape, sch.get(last).writes[0].source.shape
    analyzer = sym.Analyzer()
    size = analyzer.simplify(_product(output) - _product(result))
    return not (isinstance(size, tirx.IntImm) and size.value == 0)


def _product(shape) -> tirx.PrimExpr:
    total = tirx.const(1, "int64")
    for dim in shape:
        total = total * tirx.Cast("int64", dim)
    return total
