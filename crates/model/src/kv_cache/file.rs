//! A cache's live positions on disk, for conversations kept between runs: every element
//! little-endian, written and read a (layer, head) run at a time, straight from and into
//! the cache's memory where the target already is little-endian.

use half::f16;

use super::store::{row_bytes, Store};
use super::KvCache;
use crate::{ModelError, Result};

/// Elements stored on disk as their little-endian bytes ([`KvCache::write_live`]).
///
/// # Safety
/// Implementors have no padding and every bit pattern of their size is a valid value, so
/// a slice of them may be viewed, and overwritten, as bytes.
#[cfg_attr(all(target_endian = "little", not(test)), allow(dead_code))]
unsafe trait LeBytes: Copy {
    const SIZE: usize;
    fn put_le(self, out: &mut [u8]);
    fn get_le(bytes: &[u8]) -> Self;
}
// SAFETY: f32 (4 bytes), f16 (a transparent u16) and i8 have no padding, and any bits are
// a value of each (NaN payloads included).
unsafe impl LeBytes for f32 {
    const SIZE: usize = 4;
    fn put_le(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
    fn get_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}
// SAFETY: as above.
unsafe impl LeBytes for f16 {
    const SIZE: usize = 2;
    fn put_le(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_bits().to_le_bytes());
    }
    fn get_le(b: &[u8]) -> Self {
        f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
    }
}
// SAFETY: as above.
unsafe impl LeBytes for i8 {
    const SIZE: usize = 1;
    fn put_le(self, out: &mut [u8]) {
        out[0] = self as u8;
    }
    fn get_le(b: &[u8]) -> Self {
        b[0] as i8
    }
}

/// Writes `s` as little-endian bytes in one call: on a little-endian target the elements'
/// memory already is that, so a run of rows goes to the writer without a copy.
#[cfg(target_endian = "little")]
fn write_le<T: LeBytes>(w: &mut dyn std::io::Write, s: &[T]) -> std::io::Result<()> {
    // SAFETY: `T: LeBytes` has no padding, so every byte of the slice is initialised; the
    // view covers exactly the slice's memory and borrows it immutably.
    let bytes =
        unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) };
    w.write_all(bytes)
}

#[cfg(not(target_endian = "little"))]
fn write_le<T: LeBytes>(w: &mut dyn std::io::Write, s: &[T]) -> std::io::Result<()> {
    write_le_portable(w, s)
}

/// Fills `s` from little-endian bytes, reading straight into its memory where that is
/// the layout already.
#[cfg(target_endian = "little")]
fn read_le<T: LeBytes>(r: &mut dyn std::io::Read, s: &mut [T]) -> std::io::Result<()> {
    // SAFETY: `T: LeBytes` has no padding and every bit pattern is a valid `T`, so any
    // bytes written through the view leave valid elements; the view covers exactly the
    // slice's memory and borrows it mutably for its lifetime.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s))
    };
    r.read_exact(bytes)
}

#[cfg(not(target_endian = "little"))]
fn read_le<T: LeBytes>(r: &mut dyn std::io::Read, s: &mut [T]) -> std::io::Result<()> {
    read_le_portable(r, s)
}

/// Bytes converted per chunk by the portable paths.
#[cfg_attr(all(target_endian = "little", not(test)), allow(dead_code))]
const LE_CHUNK_BYTES: usize = 64 * 1024;

/// [`write_le`] for any byte order: element by element through a reusable buffer.
#[cfg_attr(all(target_endian = "little", not(test)), allow(dead_code))]
fn write_le_portable<T: LeBytes>(w: &mut dyn std::io::Write, s: &[T]) -> std::io::Result<()> {
    let per_chunk = LE_CHUNK_BYTES / T::SIZE;
    let mut buf = vec![0u8; per_chunk.min(s.len()) * T::SIZE];
    for chunk in s.chunks(per_chunk) {
        let out = &mut buf[..chunk.len() * T::SIZE];
        for (x, b) in chunk.iter().zip(out.chunks_exact_mut(T::SIZE)) {
            x.put_le(b);
        }
        w.write_all(out)?;
    }
    Ok(())
}

/// [`read_le`] for any byte order.
#[cfg_attr(all(target_endian = "little", not(test)), allow(dead_code))]
fn read_le_portable<T: LeBytes>(r: &mut dyn std::io::Read, s: &mut [T]) -> std::io::Result<()> {
    let per_chunk = LE_CHUNK_BYTES / T::SIZE;
    let mut buf = vec![0u8; per_chunk.min(s.len()) * T::SIZE];
    for chunk in s.chunks_mut(per_chunk) {
        let bytes = &mut buf[..chunk.len() * T::SIZE];
        r.read_exact(bytes)?;
        for (x, b) in chunk.iter_mut().zip(bytes.chunks_exact(T::SIZE)) {
            *x = T::get_le(b);
        }
    }
    Ok(())
}

impl Store {
    /// Writes the first `live` rows of each of `n_runs` runs of `run` rows, run by run
    /// (INT8: a run's values, then its `live` scales).
    fn write_runs(
        &self,
        w: &mut dyn std::io::Write,
        n_runs: usize,
        run: usize,
        live: usize,
        hd: usize,
    ) -> std::io::Result<()> {
        for r in 0..n_runs {
            let elems = r * run * hd..(r * run + live) * hd;
            match self {
                Store::F32(d) => write_le(w, &d[elems])?,
                Store::F16(d) => write_le(w, &d[elems])?,
                Store::Int8 { q, scales } => {
                    write_le(w, &q[elems])?;
                    write_le(w, &scales[r * run..r * run + live])?;
                }
            }
        }
        Ok(())
    }

    /// Fills what [`Store::write_runs`] wrote for `live` rows per run into runs of `run`
    /// rows.
    fn read_runs(
        &mut self,
        rd: &mut dyn std::io::Read,
        n_runs: usize,
        run: usize,
        live: usize,
        hd: usize,
    ) -> std::io::Result<()> {
        for r in 0..n_runs {
            let elems = r * run * hd..(r * run + live) * hd;
            match self {
                Store::F32(d) => read_le(rd, &mut d[elems])?,
                Store::F16(d) => read_le(rd, &mut d[elems])?,
                Store::Int8 { q, scales } => {
                    read_le(rd, &mut q[elems])?;
                    read_le(rd, &mut scales[r * run..r * run + live])?;
                }
            }
        }
        Ok(())
    }
}

impl KvCache {
    /// Writes the live positions (rows given back as the zeros they read as), for a
    /// conversation kept on disk: keys, then values; each
    /// as its (layer, head) runs in order, a run's first `len` rows (INT8: the run's
    /// values, then its `len` row scales); every element little-endian (f16 as its bits).
    /// Exactly [`KvCache::written_bytes`] bytes, whatever the window or reserve, so a
    /// reader may lay them out on another. A run is one write: at memory speed, since resuming
    /// must cost a small fraction of prefilling again.
    pub fn write_live(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        debug_assert!(self.len <= self.capacity);
        let n_runs = self.n_layer * self.n_head_kv;
        for store in [&self.k, &self.v] {
            store.write_runs(w, n_runs, self.stride, self.len, self.head_dim)?;
        }
        Ok(())
    }

    /// Bytes [`KvCache::write_live`] writes: every live position of every layer, those a
    /// sliding-window layer gave back included (more than [`KvCache::used_bytes`] then).
    pub fn written_bytes(&self) -> usize {
        2 * row_bytes(self.kind, self.head_dim) * self.n_layer * self.n_head_kv * self.len
    }

    /// Fills this empty cache's first `n` positions from what [`KvCache::write_live`]
    /// wrote for a cache of `n` live positions of the same model and type (the caller
    /// checks that: the bytes carry no layout); then `n` positions are live. On error the
    /// cache stays empty (rows may have been written, but nothing reads past `len`).
    pub fn read_live(&mut self, n: usize, r: &mut dyn std::io::Read) -> Result<()> {
        if self.len != 0 || n > self.capacity {
            return Err(ModelError::BadConfig(format!(
                "reading {n} positions needs an empty cache holding them; this one holds {} of {}",
                self.len, self.capacity
            )));
        }
        let (n_runs, stride, hd) = (self.n_layer * self.n_head_kv, self.stride, self.head_dim);
        for store in [&mut self.k, &mut self.v] {
            store
                .read_runs(r, n_runs, stride, n, hd)
                .map_err(ModelError::KvIo)?;
        }
        self.len = n;
        // The writer may have given back rows older than its window (they were written as
        // zeros): counted as given back here too, and released from memory again.
        self.release_out_of_window();
        Ok(())
    }
}

#[cfg(test)]
mod kv_file_tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::{Activation, Architecture, KvType};
    use pyramid_kernels::attention::KvRows;

    fn cfg() -> ModelConfig {
        ModelConfig {
            arch: Architecture::Llama,
            name: "tiny".to_string(),
            n_vocab: 32,
            n_embd: 32,
            n_layer: 3,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 8,
            n_ff: 64,
            n_ctx_train: 256,
            n_rot: 8,
            rope_base: 10_000.0,
            rms_eps: 1e-5,
            embedding_scale: 1.0,
            attention_scale: 0.125,
            activation: Activation::Silu,
            sliding_window: None,
            rope_factors: None,
            rope_scale: 1.0,
            pooling: None,
            no_rope_layers: Vec::new(),
            experts: None,
        }
    }

    /// A cache with `n` live positions of distinct values.
    fn filled(cache: &mut KvCache, n: usize) {
        let c = cfg();
        for layer in 0..c.n_layer {
            for h in 0..c.n_head_kv {
                let keys: Vec<f32> = (0..n * c.head_dim)
                    .map(|i| (layer * 1000 + h * 100) as f32 + i as f32 * 0.37 - 7.0)
                    .collect();
                let values: Vec<f32> = keys.iter().map(|x| -x * 1.5 + 0.25).collect();
                cache
                    .write_head_rows(layer, h, 0, &keys, &values)
                    .expect("rows fit");
            }
        }
        cache.commit(n).expect("room");
    }

    fn same_rows(a: &KvCache, b: &KvCache, n: usize) {
        let c = cfg();
        for layer in 0..c.n_layer {
            for h in 0..c.n_head_kv {
                match (a.head(layer, h, n), b.head(layer, h, n)) {
                    (KvRows::F32 { keys, values }, KvRows::F32 { keys: k, values: v }) => {
                        let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(keys), bits(k));
                        assert_eq!(bits(values), bits(v));
                    }
                    (KvRows::F16 { keys, values }, KvRows::F16 { keys: k, values: v }) => {
                        let bits = |s: &[f16]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(keys), bits(k));
                        assert_eq!(bits(values), bits(v));
                    }
                    (
                        KvRows::Int8 {
                            keys,
                            key_scales,
                            values,
                            value_scales,
                        },
                        KvRows::Int8 {
                            keys: k,
                            key_scales: ks,
                            values: v,
                            value_scales: vs,
                        },
                    ) => {
                        let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!((keys, values), (k, v));
                        assert_eq!(bits(key_scales), bits(ks));
                        assert_eq!(bits(value_scales), bits(vs));
                    }
                    _ => panic!("different KV types"),
                }
            }
        }
    }

    #[test]
    fn kv_file_round_trip_every_type_and_layout() {
        let c = cfg();
        let n = 13;
        for kind in KvType::ALL {
            let sources = [
                KvCache::new(&c, 16, kind),
                KvCache::with_reserve(&c, 16, 128, kind),
            ];
            for mut src in sources {
                filled(&mut src, n);
                let mut bytes = Vec::new();
                src.write_live(&mut bytes).expect("write to memory");
                assert_eq!(bytes.len(), src.written_bytes(), "{kind}");
                let destinations = [
                    KvCache::new(&c, n, kind),
                    KvCache::new(&c, 64, kind),
                    KvCache::with_reserve(&c, 32, 200, kind),
                ];
                for mut dst in destinations {
                    dst.read_live(n, &mut bytes.as_slice()).expect("read back");
                    assert_eq!(dst.len(), n);
                    same_rows(&src, &dst, n);
                    let mut again = Vec::new();
                    dst.write_live(&mut again).expect("write to memory");
                    assert_eq!(again, bytes, "{kind}: rewritten bytes differ");
                }
            }
        }
    }

    #[test]
    fn kv_file_truncated_input_is_an_error_and_leaves_the_cache_empty() {
        let c = cfg();
        for kind in KvType::ALL {
            let mut src = KvCache::new(&c, 16, kind);
            filled(&mut src, 10);
            let mut bytes = Vec::new();
            src.write_live(&mut bytes).expect("write to memory");
            for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
                let mut dst = KvCache::new(&c, 16, kind);
                let err = dst
                    .read_live(10, &mut &bytes[..cut])
                    .expect_err("truncated input");
                assert!(matches!(err, ModelError::KvIo(_)), "{err}");
                assert_eq!(dst.len(), 0);
            }
        }
    }

    #[test]
    fn kv_file_read_needs_an_empty_cache_with_room() {
        let c = cfg();
        let mut src = KvCache::new(&c, 16, KvType::F32);
        filled(&mut src, 10);
        let mut bytes = Vec::new();
        src.write_live(&mut bytes).expect("write to memory");
        let mut small = KvCache::new(&c, 8, KvType::F32);
        assert!(small.read_live(10, &mut bytes.as_slice()).is_err());
        let mut busy = KvCache::new(&c, 16, KvType::F32);
        filled(&mut busy, 1);
        assert!(busy.read_live(10, &mut bytes.as_slice()).is_err());
        assert_eq!(busy.len(), 1);
    }

    #[test]
    fn kv_file_portable_bytes_match_the_fast_path() {
        let xs: Vec<f32> = (0..70_000).map(|i| i as f32 * -0.5 + 3.0).collect();
        let (mut fast, mut portable) = (Vec::new(), Vec::new());
        write_le(&mut fast, &xs).expect("write");
        write_le_portable(&mut portable, &xs).expect("write");
        assert_eq!(fast, portable);
        let expected: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(fast, expected);
        let mut back = vec![0f32; xs.len()];
        read_le_portable(&mut fast.as_slice(), &mut back).expect("read");
        assert_eq!(back, xs);
        let hs: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
        let (mut fast, mut portable) = (Vec::new(), Vec::new());
        write_le(&mut fast, &hs).expect("write");
        write_le_portable(&mut portable, &hs).expect("write");
        assert_eq!(fast, portable);
        let qs: Vec<i8> = (0..300).map(|i| (i % 256) as u8 as i8).collect();
        let (mut fast, mut portable) = (Vec::new(), Vec::new());
        write_le(&mut fast, &qs).expect("write");
        write_le_portable(&mut portable, &qs).expect("write");
        assert_eq!(fast, portable);
        let mut back = vec![0i8; qs.len()];
        read_le(&mut fast.as_slice(), &mut back).expect("read");
        assert_eq!(back, qs);
    }
}
