//! AMX-INT8 version of the W8A8 kernel, for prefill-sized batches. One tile multiply
//! (`tdpbssd`) takes 16 activation rows × 32 bytes and one packed weight block's eight
//! groups, which is the layout [`super::PackedI8`] already has (16 outputs × 4 `k` per
//! 64-byte row), and gives the exact integer sums of one scale block for 16 × 16 outputs.
//! The sums go through memory to be scaled and accumulated in float in `k` order, as the
//! scalar oracle does, so the result is bit for bit the oracle's. Both operands are signed
//! bytes, so unlike VNNI no +128 offset is needed.
//!
//! INT4 weights take the same passes a chunk at a time, unpacked to bytes first
//! ([`gemm_blocks_amx_i4`]).
//!
//! Rust has no stable AMX intrinsics, so the tile instructions are inline assembly on
//! registers this module fixes: sums in tmm0–3 (`2 · activation tile + weight tile`),
//! activations in tmm4–5, weights in tmm6–7. Linux hands out the tile state only after
//! `arch_prctl(ARCH_REQ_XCOMP_PERM)`; [`enable`] asks once, and [`crate::isa::Isa::Amx`] is
//! only detected when it was granted.

use std::arch::asm;
use std::arch::x86_64::*;
use std::ops::Range;

use std::cell::RefCell;

use crate::scales::Scales;

use super::x86::{block_chunks, prefetch_ahead, store_block_row, GROUP_BYTES};
use super::{PackedI8, QuantizedView, BLOCK_K, GROUPS_PER_BLOCK, K_PER_GROUP, ROWS_PER_BLOCK};
use crate::int4::x86::split_nibbles;
use crate::int4::{PackedI4, GROUP_BYTES as I4_GROUP_BYTES};

/// Rows of one activation tile (the most a tile holds).
const TILE_ROWS: usize = 16;
/// Activation rows a pass over a weight chunk takes: two tiles.
const ROWS_PER_PASS: usize = 2 * TILE_ROWS;

/// Whether this CPU has AMX-INT8 and the OS lets this process use the tiles, asking for
/// them for every thread of the process. [`crate::isa::Isa::detect`] calls it once and
/// keeps the answer.
pub(crate) fn enable() -> bool {
    cpu_has_amx_int8() && os_grants_tiles()
}

fn cpu_has_amx_int8() -> bool {
    // SAFETY: `cpuid` exists on every x86-64 CPU; leaf 7 is read only when it exists.
    unsafe {
        if __cpuid(0).eax < 7 {
            return false;
        }
        let osxsave = __cpuid(1).ecx & (1 << 27) != 0;
        let leaf7 = __cpuid_count(7, 0);
        let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
        // XCR0 bits 17–18: the OS saves the tile configuration and data on context switches.
        osxsave && tile && int8 && xcr0() & (0b11 << 17) == 0b11 << 17
    }
}

/// # Safety
/// The CPU has XSAVE and the OS enabled it (CPUID.1:ECX.OSXSAVE).
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    _xgetbv(0)
}

#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: this `arch_prctl` request reads only its two integer arguments.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// The 64-byte operand of `ldtilecfg`: palette 1, then each tile's bytes per row and rows.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    /// Tiles for a pass over `rows` (1..=32) activation rows: the first 16 in tmm4 with
    /// their sums in tmm0–1, the rest in tmm5 with theirs in tmm2–3 (left unconfigured
    /// when there are none), one weight block in each of tmm6–7.
    fn for_rows(rows: usize) -> Self {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        let mut set = |tile: usize, rows: usize, row_bytes: usize| {
            bytes[16 + 2 * tile] = row_bytes as u8;
            bytes[48 + tile] = rows as u8;
        };
        for (t, rows_t) in [rows.min(TILE_ROWS), rows.saturating_sub(TILE_ROWS)]
            .into_iter()
            .enumerate()
        {
            if rows_t > 0 {
                set(2 * t, rows_t, 4 * ROWS_PER_BLOCK);
                set(2 * t + 1, rows_t, 4 * ROWS_PER_BLOCK);
                set(4 + t, rows_t, BLOCK_K);
            }
        }
        set(6, GROUPS_PER_BLOCK, GROUP_BYTES);
        set(7, GROUPS_PER_BLOCK, GROUP_BYTES);
        Self(bytes)
    }

    /// # Safety
    /// [`enable`] returned true.
    #[inline(always)]
    unsafe fn load(&self) {
        asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(), options(nostack, readonly));
    }
}

/// # Safety
/// A configuration is loaded whose tile `T` has `rows` rows of `row_bytes`; `src` holds
/// that many rows `stride` bytes apart.
#[inline(always)]
unsafe fn tile_load<const T: usize>(src: *const i8, stride: usize) {
    asm!("tileloadd tmm{t}, [{src} + {stride}*1]", t = const T, src = in(reg) src,
        stride = in(reg) stride, options(nostack, readonly));
}

/// Zeroes sums `C` and adds the products of activations `A` and weights `B` to them.
///
/// # Safety
/// A configuration is loaded whose tiles `C`, `A` and `B` agree in shape, and `A`, `B`
/// were loaded.
#[inline(always)]
unsafe fn tile_dot<const C: usize, const A: usize, const B: usize>() {
    asm!("tilezero tmm{c}", "tdpbssd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A,
        b = const B, options(nostack, nomem));
}

/// # Safety
/// As [`tile_load`], with `dst` writable for the tile's rows 64 bytes apart.
#[inline(always)]
unsafe fn tile_store<const T: usize>(dst: *mut [i32; ROWS_PER_BLOCK]) {
    asm!("tilestored [{dst} + {stride}*1], tmm{t}", t = const T, dst = in(reg) dst,
        stride = in(reg) 4 * ROWS_PER_BLOCK, options(nostack));
}

/// What the tile passes read of a weight matrix: INT8 weights in the packed layout from
/// block `first` on (the matrix's own, or an INT4 chunk unpacked to it), and the scales,
/// and for INT4 the minimums, of the whole matrix.
struct TileWeights<'w> {
    data: &'w [i8],
    first: usize,
    n: usize,
    k_pad: usize,
    scales: &'w Scales,
    mins: Option<&'w Scales>,
    /// Whether `data` is read from memory (not a chunk just unpacked into cache), so the
    /// passes ask for it ahead.
    streamed: bool,
}

impl TileWeights<'_> {
    fn n_blocks(&self) -> usize {
        self.k_pad / BLOCK_K
    }

    /// Byte offset in `data` of scale block `kb` of weight block `block`.
    #[inline(always)]
    fn offset(&self, block: usize, kb: usize) -> usize {
        ((block - self.first) * (self.k_pad / K_PER_GROUP) + kb * GROUPS_PER_BLOCK) * GROUP_BYTES
    }
}

/// # Safety
/// [`enable`] returned true and the CPU has AVX-512 F/BW; `out` points to `m * w.n` floats
/// and no other thread writes the columns of `blocks`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn gemm_blocks_amx(
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: *mut f32,
    blocks: Range<usize>,
) {
    let weights = TileWeights {
        data: &w.data,
        first: 0,
        n: w.n,
        k_pad: w.k_pad,
        scales: &w.scales,
        mins: w.mins.as_ref(),
        streamed: true,
    };
    let mut tiles = Tiles::new();
    for chunk in block_chunks(blocks, ROWS_PER_BLOCK * w.k_pad) {
        tiles.chunk_passes(a, &weights, out, chunk);
    }
}

/// W4A8 on the tiles: each chunk of weight blocks that fits in L2 unpacked to signed bytes
/// (the nibbles' values, 0 to 15) in the INT8 layout, then multiplied as INT8, with each
/// block's minimum folded in as the INT4 kernels do. A prefill reads every chunk once from
/// memory and multiplies it by every row, so the unpacking is paid once per chunk.
///
/// # Safety
/// As [`gemm_blocks_amx`].
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn gemm_blocks_amx_i4(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    blocks: Range<usize>,
) {
    thread_local! {
        /// One chunk of unpacked weights per thread, kept between calls.
        static UNPACKED: RefCell<Vec<i8>> = const { RefCell::new(Vec::new()) };
    }
    UNPACKED.with_borrow_mut(|unpacked| {
        let mut tiles = Tiles::new();
        for chunk in block_chunks(blocks, ROWS_PER_BLOCK * w.k_pad) {
            unpack_i4(w, chunk.clone(), unpacked);
            let weights = TileWeights {
                data: &unpacked[..],
                first: chunk.start,
                n: w.n,
                k_pad: w.k_pad,
                scales: &w.scales,
                mins: Some(&w.mins),
                streamed: false,
            };
            tiles.chunk_passes(a, &weights, out, chunk);
        }
    });
}

/// Weight blocks `blocks` of `w` as signed bytes in the INT8 layout, into `out`: a packed
/// group's low nibbles are rows 0–7 of its four `k` and its high nibbles rows 8–15, which
/// side by side are the INT8 group.
#[target_feature(enable = "avx2")]
unsafe fn unpack_i4(w: &PackedI4, blocks: Range<usize>, out: &mut Vec<i8>) {
    let groups = blocks.len() * w.k_pad / K_PER_GROUP;
    // Every byte is written below: grown, never cleared.
    if out.len() < groups * GROUP_BYTES {
        out.resize(groups * GROUP_BYTES, 0);
    }
    let src = &w.data[blocks.start * (w.k_pad / K_PER_GROUP) * I4_GROUP_BYTES..]
        [..groups * I4_GROUP_BYTES];
    for (packed, unpacked) in src
        .chunks_exact(I4_GROUP_BYTES)
        .zip(out.chunks_exact_mut(GROUP_BYTES))
    {
        // SAFETY: `packed` holds 32 bytes and `unpacked` 64.
        let [lo, hi] = split_nibbles(_mm256_loadu_si256(packed.as_ptr().cast()));
        _mm256_storeu_si256(unpacked.as_mut_ptr().cast(), lo);
        _mm256_storeu_si256(unpacked.as_mut_ptr().add(32).cast(), hi);
    }
}

/// The tile configuration loaded on this thread and the buffer the sums go through.
struct Tiles {
    /// Rows of the loaded configuration; 0 before the first.
    configured: usize,
    /// Two buffers for every pass, used in turn ([`pass`]): zeroing them per pass cost
    /// 3-4 % of a prefill.
    sums: [BlockSums; 2],
}

impl Tiles {
    fn new() -> Self {
        Self {
            configured: 0,
            sums: [const { BlockSums([[[0; ROWS_PER_BLOCK]; TILE_ROWS]; 4]) }; 2],
        }
    }

    /// Every row of `a` by the weight blocks of `chunk`, in passes of up to 32 rows and
    /// two blocks.
    ///
    /// # Safety
    /// As [`gemm_blocks_amx`], for the columns of `chunk`, which `weights` holds.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn chunk_passes(
        &mut self,
        a: &QuantizedView<'_>,
        w: &TileWeights<'_>,
        out: *mut f32,
        chunk: Range<usize>,
    ) {
        let m = a.m;
        let sums = &mut self.sums;
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(ROWS_PER_PASS);
            if rows != self.configured {
                TileConfig::for_rows(rows).load();
                self.configured = rows;
            }
            let mut b = chunk.start;
            while b < chunk.end {
                let pair = chunk.end - b >= 2;
                match (rows > TILE_ROWS, pair) {
                    (true, true) => pass::<2, 2>(a, w, out, row, rows, b, sums),
                    (true, false) => pass::<2, 1>(a, w, out, row, rows, b, sums),
                    (false, true) => pass::<1, 2>(a, w, out, row, rows, b, sums),
                    (false, false) => pass::<1, 1>(a, w, out, row, rows, b, sums),
                }
                b += if pair { 2 } else { 1 };
            }
            row += rows;
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        if self.configured > 0 {
            // SAFETY: a configuration was loaded, so the CPU has AMX and the OS granted it.
            unsafe { asm!("tilerelease", options(nostack, nomem)) };
        }
    }
}

/// Integer sums of one scale block as the tiles store them: `[sum tile][row][output]`.
#[repr(C, align(64))]
struct BlockSums([[[i32; ROWS_PER_BLOCK]; TILE_ROWS]; 4]);

/// Integer sums of scale block `kb` for the activation tiles of `row0` and weight blocks
/// from `block0`, into `sums`.
///
/// # Safety
/// As [`pass`], with the tiles configured for its rows.
#[inline(always)]
unsafe fn block_sums<const MT: usize, const NB: usize>(
    a: &QuantizedView<'_>,
    w: &TileWeights<'_>,
    row0: usize,
    block0: usize,
    kb: usize,
    sums: &mut BlockSums,
) {
    let activations = |t: usize| {
        a.data
            .as_ptr()
            .add((row0 + t * TILE_ROWS) * a.k_pad + kb * BLOCK_K)
    };
    let weights = |j: usize| w.data.as_ptr().add(w.offset(block0 + j, kb));
    if w.streamed && row0 == 0 {
        prefetch_ahead::<NB, _>(w.data, w.k_pad, GROUP_BYTES, block0 - w.first, kb);
    }
    tile_load::<4>(activations(0), a.k_pad);
    tile_load::<6>(weights(0), GROUP_BYTES);
    tile_dot::<0, 4, 6>();
    tile_store::<0>(sums.0[0].as_mut_ptr());
    if NB == 2 {
        tile_load::<7>(weights(1), GROUP_BYTES);
        tile_dot::<1, 4, 7>();
        tile_store::<1>(sums.0[1].as_mut_ptr());
    }
    if MT == 2 {
        tile_load::<5>(activations(1), a.k_pad);
        tile_dot::<2, 5, 6>();
        tile_store::<2>(sums.0[2].as_mut_ptr());
        if NB == 2 {
            tile_dot::<3, 5, 7>();
            tile_store::<3>(sums.0[3].as_mut_ptr());
        }
    }
}

/// Outputs of `rows` activation rows from `row0` (in `MT` tiles) and `NB` weight blocks
/// from `block0`, over every scale block of `k`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn pass<const MT: usize, const NB: usize>(
    a: &QuantizedView<'_>,
    w: &TileWeights<'_>,
    out: *mut f32,
    row0: usize,
    rows: usize,
    block0: usize,
    sums: &mut [BlockSums; 2],
) {
    let n_blocks = w.n_blocks();
    let tile_rows = [rows.min(TILE_ROWS), rows.saturating_sub(TILE_ROWS)];
    let mut acc = [[[_mm512_setzero_ps(); NB]; TILE_ROWS]; MT];
    block_sums::<MT, NB>(a, w, row0, block0, 0, &mut sums[0]);
    for kb in 0..n_blocks {
        // The next scale block's products go to the tiles before this one's sums are
        // folded, so the tiles and the vector units work at once.
        if kb + 1 < n_blocks {
            block_sums::<MT, NB>(a, w, row0, block0, kb + 1, &mut sums[(kb + 1) % 2]);
        }
        let sums = &sums[kb % 2];
        for j in 0..NB {
            let w_scale = w.scales.load16_avx512(block0 + j, kb);
            let w_min = w.mins.map(|mins| mins.load16_avx512(block0 + j, kb));
            for (t, acc_t) in acc.iter_mut().enumerate() {
                let tile_sums = &sums.0[2 * t + j];
                for (r, acc_tr) in acc_t.iter_mut().enumerate().take(tile_rows[t]) {
                    let at = (row0 + t * TILE_ROWS + r) * n_blocks + kb;
                    let a_scale = *a.scales.get_unchecked(at);
                    let dot = _mm512_load_si512(tile_sums[r].as_ptr().cast());
                    acc_tr[j] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(dot),
                        _mm512_mul_ps(w_scale, _mm512_set1_ps(a_scale)),
                        acc_tr[j],
                    );
                    // INT4, Q5_1, Q5_K: `min · Σ a` after the scaled sum, as the other kernels add it.
                    if let Some(w_min) = w_min {
                        let a_sum = *a.block_sums.get_unchecked(at) as f32 * a_scale;
                        acc_tr[j] = _mm512_fmadd_ps(w_min, _mm512_set1_ps(a_sum), acc_tr[j]);
                    }
                }
            }
        }
    }
    for (t, acc_t) in acc.iter().enumerate() {
        for (r, acc_tr) in acc_t.iter().enumerate().take(tile_rows[t]) {
            for (j, acc_trj) in acc_tr.iter().enumerate() {
                store_block_row(out, w.n, row0 + t * TILE_ROWS + r, block0 + j, *acc_trj);
            }
        }
    }
}
