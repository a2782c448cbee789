//! Tensor vocabulary shared by the Triton layer, batch assembly and the engines:
//! element types, shapes, aligned host buffers. Where bytes live is the CUDA crate's
//! vocabulary ([`Bytes`], [`Device`]), re-exported here. Nothing here knows Triton or
//! an engine.

use crate::error::{Error, Result};

pub use triton_rust_cuda::{
    Bytes, BytesMut, Device, DeviceBuffer, DeviceOps, DeviceView, DeviceViewMut,
};

/// Element type of a tensor, named as Triton's model config names them (`TYPE_FP32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    F32,
    F64,
    Bf16,
    /// Variable-length byte strings (Triton `BYTES`).
    Bytes,
}

impl DataType {
    /// Bytes per element; `None` for variable-size strings.
    pub fn size(self) -> Option<usize> {
        use DataType::*;
        Some(match self {
            Bool | U8 | I8 => 1,
            U16 | I16 | F16 | Bf16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            Bytes => return None,
        })
    }

    /// The name used in model configs, e.g. `TYPE_FP32`.
    pub fn config_name(self) -> &'static str {
        use DataType::*;
        match self {
            Bool => "TYPE_BOOL",
            U8 => "TYPE_UINT8",
            U16 => "TYPE_UINT16",
            U32 => "TYPE_UINT32",
            U64 => "TYPE_UINT64",
            I8 => "TYPE_INT8",
            I16 => "TYPE_INT16",
            I32 => "TYPE_INT32",
            I64 => "TYPE_INT64",
            F16 => "TYPE_FP16",
            F32 => "TYPE_FP32",
            F64 => "TYPE_FP64",
            Bf16 => "TYPE_BF16",
            Bytes => "TYPE_STRING",
        }
    }

    /// The name used on the wire (KServe v2), e.g. `FP32`.
    pub fn wire_name(self) -> &'static str {
        match self {
            DataType::Bytes => "BYTES",
            other => &other.config_name()[5..],
        }
    }

    pub fn from_config_name(name: &str) -> Result<DataType> {
        use DataType::*;
        const ALL: [DataType; 14] =
            [Bool, U8, U16, U32, U64, I8, I16, I32, I64, F16, F32, F64, Bf16, Bytes];
        ALL.into_iter()
            .find(|d| d.config_name() == name)
            .ok_or_else(|| Error::invalid_arg(format!("unknown data_type '{name}'")))
    }

    pub fn is_float(self) -> bool {
        matches!(self, DataType::F16 | DataType::F32 | DataType::F64 | DataType::Bf16)
    }
}

/// Number of elements of a fully known shape; errors on a negative dimension or overflow.
pub fn element_count(shape: &[i64]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        if d < 0 {
            return Err(Error::invalid_arg(format!("shape {shape:?} has a negative dimension")));
        }
        acc.checked_mul(d as usize)
            .ok_or_else(|| Error::invalid_arg(format!("shape {shape:?} is too large")))
    })
}

/// Does a concrete shape fit a pattern where -1 means "any size"?
pub fn shape_matches(pattern: &[i64], shape: &[i64]) -> bool {
    pattern.len() == shape.len() && pattern.iter().zip(shape).all(|(&p, &s)| p == -1 || p == s)
}

/// A byte buffer aligned for any element type, so engines may read it as `f64`/`i64`.
///
/// Large buffers go back to a small per-thread store when dropped and are handed out
/// again by [`AlignedBuf::for_overwrite`]: a batch assembled on a model instance's
/// thread then reuses the pages of the previous batch instead of faulting in fresh ones
/// (glibc maps every allocation above `malloc-mmap-threshold` anew). The store goes
/// with the thread, so an unloaded instance leaves nothing behind.
pub struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

/// Buffers at least this large are kept for reuse...
const REUSE_MIN: usize = 256 << 10;
/// ...up to this size...
const REUSE_MAX: usize = 256 << 20;
/// ...and this many per thread (a batch assembles one buffer per host input that several
/// requests share; models with more large inputs fall back to fresh allocations).
const REUSE_COUNT: usize = 2;

thread_local! {
    static SPARE: std::cell::RefCell<Vec<Vec<u64>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Self {
        AlignedBuf { words: vec![0u64; len.div_ceil(8)], len }
    }

    /// A buffer of `len` bytes that the caller overwrites entirely: its contents are
    /// unspecified (a reused buffer keeps what it held; it is never uninitialised).
    pub fn for_overwrite(len: usize) -> Self {
        let n = len.div_ceil(8);
        if len >= REUSE_MIN {
            let reused = SPARE
                .try_with(|s| {
                    let mut s = s.borrow_mut();
                    // the smallest kept buffer that is large enough
                    let best = s
                        .iter()
                        .enumerate()
                        .filter(|(_, w)| w.capacity() >= n)
                        .min_by_key(|(_, w)| w.capacity())
                        .map(|(i, _)| i);
                    best.map(|i| s.swap_remove(i))
                })
                .ok()
                .flatten();
            if let Some(mut words) = reused {
                // within capacity: no reallocation; only words past the old length are written
                words.resize(n, 0);
                return AlignedBuf { words, len };
            }
        }
        Self::zeroed(len)
    }
    pub fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let bytes = self.words.capacity() * 8;
        if !(REUSE_MIN..=REUSE_MAX).contains(&bytes) {
            return;
        }
        let words = std::mem::take(&mut self.words);
        let _ = SPARE.try_with(|s| {
            let mut s = s.borrow_mut();
            s.push(words);
            if s.len() > REUSE_COUNT {
                // keep the largest
                let smallest =
                    s.iter().enumerate().min_by_key(|(_, w)| w.capacity()).map(|(i, _)| i);
                if let Some(i) = smallest {
                    s.swap_remove(i);
                }
            }
        });
    }
}

/// Triton's layout of a BYTES tensor: each element is a 4-byte little-endian length
/// followed by that many bytes, elements back to back. Returns each element's bytes, or
/// what breaks the layout.
pub fn decode_strings(bytes: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let Some(prefix) = bytes.get(at..at + 4) else {
            return Err(Error::invalid_arg(format!(
                "element {} has only {} of its 4 length bytes",
                out.len(),
                bytes.len() - at
            )));
        };
        let len = u32::from_le_bytes(prefix.try_into().expect("4 bytes")) as usize;
        let start = at + 4;
        let Some(item) = start.checked_add(len).and_then(|end| bytes.get(start..end)) else {
            return Err(Error::invalid_arg(format!(
                "element {} says it has {len} bytes but only {} remain",
                out.len(),
                bytes.len() - start
            )));
        };
        out.push(item);
        at = start + len;
    }
    Ok(out)
}

/// Writes `items` in Triton's BYTES layout (see [`decode_strings`]).
pub fn encode_strings<T: AsRef<[u8]>>(items: &[T]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(items.iter().map(|s| s.as_ref().len() + 4).sum());
    for (i, s) in items.iter().enumerate() {
        let len = u32::try_from(s.as_ref().len())
            .map_err(|_| Error::invalid_arg(format!("string element {i} is over 4 GiB")))?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(s.as_ref());
    }
    Ok(out)
}

/// Finds the first non-finite value in a float tensor's bytes, as an element index.
pub fn first_non_finite(dtype: DataType, bytes: &[u8]) -> Option<usize> {
    match dtype {
        DataType::F32 => bytes
            .chunks_exact(4)
            .position(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
        DataType::F64 => bytes
            .chunks_exact(8)
            .position(|c| !f64::from_le_bytes(c.try_into().expect("chunk of 8")).is_finite()),
        // Half formats: exponent all ones means Inf or NaN.
        DataType::F16 => {
            bytes.chunks_exact(2).position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00)
        }
        DataType::Bf16 => {
            bytes.chunks_exact(2).position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn large_buffers_are_reused_on_their_thread() {
        let a = AlignedBuf::for_overwrite(1 << 20);
        let at = a.as_slice().as_ptr();
        drop(a);
        let b = AlignedBuf::for_overwrite(600 << 10);
        assert_eq!(b.as_slice().as_ptr(), at, "the freed 1 MiB buffer serves a smaller request");
        assert_eq!(b.len(), 600 << 10);
        // another thread has its own store
        let other = std::thread::spawn(move || {
            AlignedBuf::for_overwrite(600 << 10).as_slice().as_ptr() as usize
        })
        .join()
        .unwrap();
        assert_ne!(other, at as usize);
        drop(b);
        // small buffers are not kept
        let c = AlignedBuf::for_overwrite(1000);
        assert!(c.as_slice().iter().all(|&x| x == 0));
    }

    use super::*;

    #[test]
    fn names_round_trip() {
        for name in ["TYPE_FP32", "TYPE_INT64", "TYPE_STRING", "TYPE_BF16", "TYPE_BOOL"] {
            assert_eq!(DataType::from_config_name(name).unwrap().config_name(), name);
        }
        assert_eq!(DataType::F16.wire_name(), "FP16");
        assert_eq!(DataType::Bytes.wire_name(), "BYTES");
        assert!(DataType::from_config_name("TYPE_FP8").is_err());
    }

    #[test]
    fn shapes() {
        assert_eq!(element_count(&[2, 3, 4]).unwrap(), 24);
        assert_eq!(element_count(&[]).unwrap(), 1);
        assert!(element_count(&[2, -1]).is_err());
        assert!(shape_matches(&[-1, 16], &[8, 16]));
        assert!(!shape_matches(&[-1, 16], &[8, 15]));
        assert!(!shape_matches(&[16], &[1, 16]));
    }

    #[test]
    fn non_finite_detection() {
        let v: Vec<u8> = [1.0f32, 2.0, f32::NAN].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(first_non_finite(DataType::F32, &v), Some(2));
        let v: Vec<u8> = [1.0f64, f64::INFINITY].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(first_non_finite(DataType::F64, &v), Some(1));
        // fp16: 1.0 = 0x3c00, NaN = 0x7e00
        let v: Vec<u8> = [0x3c00u16, 0x7e00].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(first_non_finite(DataType::F16, &v), Some(1));
        assert_eq!(first_non_finite(DataType::I32, &[0xff; 8]), None);
    }

    #[test]
    fn strings_round_trip_and_malformed_layouts_are_named() {
        let items: [&[u8]; 4] = [b"spam", b"", "caf\u{e9}".as_bytes(), &[0xff, 0x00]];
        let bytes = encode_strings(&items).unwrap();
        assert_eq!(bytes.len(), 4 * 4 + 4 + 5 + 2);
        assert_eq!(decode_strings(&bytes).unwrap(), items.to_vec());
        assert_eq!(decode_strings(&[]).unwrap(), Vec::<&[u8]>::new());
        let e = decode_strings(&bytes[..bytes.len() - 1]).unwrap_err();
        assert_eq!(e.message(), "element 3 says it has 2 bytes but only 1 remain");
        let e = decode_strings(&[4, 0, 0, 0, b'a', b'b', b'c', b'd', 1, 0]).unwrap_err();
        assert_eq!(e.message(), "element 1 has only 2 of its 4 length bytes");
        let e = decode_strings(&[0xff, 0xff, 0xff, 0xff, 1]).unwrap_err();
        assert!(e.message().contains("4294967295 bytes"), "{e}");
    }

    #[test]
    fn aligned_buf_is_aligned() {
        let b = AlignedBuf::zeroed(13);
        assert_eq!(b.len(), 13);
        assert_eq!(b.as_slice().as_ptr() as usize % 8, 0);
    }
}
