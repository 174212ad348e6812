//! AMX-INT8 version of the W8A8 kernel, for prefill-sized batches. One tile multiply
//! (`tdpbssd`) takes 16 activation rows × 32 bytes and one packed weight block's eight
//! groups, which is the layout [`super::PackedI8`] already has (16 outputs × 4 `k` per
//! 64-byte row), and gives the exact integer sums of one scale block for 16 × 16 outputs.
//! The sums go through memory to be scaled and accumulated in float in `k` order, as the
//! scalar oracle does, so the result is bit for bit the oracle's. Both operands are signed
//! bytes, so unlike VNNI no +128 offset is needed.
//!
//! Rust has no stable AMX intrinsics, so the tile instructions are inline assembly on
//! registers this module fixes: sums in tmm0–3 (`2 · activation tile + weight tile`),
//! activations in tmm4–5, weights in tmm6–7. Linux hands out the tile state only after
//! `arch_prctl(ARCH_REQ_XCOMP_PERM)`; [`enable`] asks once, and [`crate::isa::Isa::Amx`] is
//! only detected when it was granted.

use std::arch::asm;
use std::arch::x86_64::*;
use std::ops::Range;

use super::x86::{block_chunks, prefetch_ahead, store_block_row, GROUP_BYTES};
use super::{PackedI8, QuantizedView, BLOCK_K, GROUPS_PER_BLOCK, K_PER_GROUP, ROWS_PER_BLOCK};

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
    let m = a.m;
    // Rows of the loaded configuration; 0 before the first.
    let mut configured = 0;
    // One buffer for every pass: zeroing 4 KiB per pass cost 3-4 % of a prefill.
    let mut sums = BlockSums([[[0; ROWS_PER_BLOCK]; TILE_ROWS]; 4]);
    for chunk in block_chunks(blocks, ROWS_PER_BLOCK * w.k_pad) {
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(ROWS_PER_PASS);
            if rows != configured {
                TileConfig::for_rows(rows).load();
                configured = rows;
            }
            let mut b = chunk.start;
            while b < chunk.end {
                let pair = chunk.end - b >= 2;
                match (rows > TILE_ROWS, pair) {
                    (true, true) => pass::<2, 2>(a, w, out, row, rows, b, &mut sums),
                    (true, false) => pass::<2, 1>(a, w, out, row, rows, b, &mut sums),
                    (false, true) => pass::<1, 2>(a, w, out, row, rows, b, &mut sums),
                    (false, false) => pass::<1, 1>(a, w, out, row, rows, b, &mut sums),
                }
                b += if pair { 2 } else { 1 };
            }
            row += rows;
        }
    }
    if configured > 0 {
        asm!("tilerelease", options(nostack, nomem));
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
    w: &PackedI8,
    row0: usize,
    block0: usize,
    kb: usize,
    sums: &mut BlockSums,
) {
    let n_groups = w.k_pad / K_PER_GROUP;
    let activations = |t: usize| {
        a.data
            .as_ptr()
            .add((row0 + t * TILE_ROWS) * a.k_pad + kb * BLOCK_K)
    };
    let weights = |j: usize| {
        w.data
            .as_ptr()
            .add(((block0 + j) * n_groups + kb * GROUPS_PER_BLOCK) * GROUP_BYTES)
    };
    if row0 == 0 {
        prefetch_ahead::<NB>(w, block0, kb);
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
    w: &PackedI8,
    out: *mut f32,
    row0: usize,
    rows: usize,
    block0: usize,
    sums: &mut BlockSums,
) {
    let n_blocks = w.n_blocks();
    let tile_rows = [rows.min(TILE_ROWS), rows.saturating_sub(TILE_ROWS)];
    let mut acc = [[[_mm512_setzero_ps(); NB]; TILE_ROWS]; MT];
    for kb in 0..n_blocks {
        block_sums::<MT, NB>(a, w, row0, block0, kb, sums);
        for j in 0..NB {
            let at = ((block0 + j) * n_blocks + kb) * ROWS_PER_BLOCK;
            let w_scale = _mm512_cvtph_ps(_mm256_loadu_si256(w.scales.as_ptr().add(at).cast()));
            for (t, acc_t) in acc.iter_mut().enumerate() {
                let tile_sums = &sums.0[2 * t + j];
                for (r, acc_tr) in acc_t.iter_mut().enumerate().take(tile_rows[t]) {
                    let row = row0 + t * TILE_ROWS + r;
                    let a_scale = _mm512_set1_ps(*a.scales.get_unchecked(row * n_blocks + kb));
                    let dot = _mm512_load_si512(tile_sums[r].as_ptr().cast());
                    acc_tr[j] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(dot),
                        _mm512_mul_ps(w_scale, a_scale),
                        acc_tr[j],
                    );
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
