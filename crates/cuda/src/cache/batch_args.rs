//! What a batch lookup is given and gives back: the keys and where they are, which table
//! each key belongs to, how rows are written, how keys go up, and where the time went.

use crate::mem::DeviceView;

/// What [`BatchLookup::run`](super::BatchLookup::run) calls with the missed indices, their keys (the callee may
/// reorder the two together), the rows to fill, and a flag per row to set when the row was
/// found (rows not found, defaults, are not cached).
pub type FetchMisses<'f, E> = dyn FnMut(&mut [i32], &mut [i64], FetchedRows<'_>, &mut [u8]) -> std::result::Result<(), E>
    + 'f;

/// The page-locked rows a fetcher fills (`dim` elements a missed key), of the type the lookup
/// was told to fetch ([`BatchLookup::set_fetched`](super::BatchLookup::set_fetched)): fp32,
/// or fp16 bits (little-endian) where every table stores its rows so, half the bytes to read
/// and send up and nothing to convert.
pub enum FetchedRows<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [u16]),
}

impl<'a> FetchedRows<'a> {
    /// The rows as fp32, when fetched so.
    pub fn f32(self) -> Option<&'a mut [f32]> {
        match self {
            FetchedRows::F32(r) => Some(r),
            FetchedRows::F16(_) => None,
        }
    }
}

/// A batch's keys (int64), where the request had them.
#[derive(Debug, Clone, Copy)]
pub enum BatchKeys<'a> {
    Host(&'a [i64]),
    /// In GPU memory (a client's CUDA shared memory, an ensemble step's output), `8 × keys` bytes.
    Device(DeviceView<'a>),
}

impl BatchKeys<'_> {
    pub fn len(&self) -> usize {
        match self {
            BatchKeys::Host(k) => k.len(),
            BatchKeys::Device(v) => v.len() / 8,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where one [`BatchLookup::run`](super::BatchLookup::run) spent its time, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchTimes {
    pub keys: usize,
    pub misses: usize,
    /// Of `misses`, the rows read below the cache: the distinct (table, key) pairs when a
    /// pooling lookup reads each once ([`PoolSpec::once`](super::PoolSpec)), else all of them.
    pub read: usize,
    /// Keys to the GPU, the lookup kernel and the miss count back.
    pub lookup_us: u64,
    /// The miss list back and the caller's reads below the cache.
    pub fetch_us: u64,
    /// Of `fetch_us`: the miss list and its keys down to the host (a wait on the GPU).
    pub keys_down_us: u64,
    /// The fetched rows to the GPU, the scatter, and the wait for the rows.
    pub scatter_us: u64,
    /// Keys below zero in a [`KeyLayout::Fixed`] batch (padding, or a client's bad key): when
    /// any, the run stopped after the kernel, read nothing below the cache and left its rows
    /// incomplete, for the caller to take another path.
    pub negative: usize,
    /// Misses the GPU read in place from the host rows it maps (all of them with
    /// `read_misses_on_gpu`, its share with `share_misses`); the fetcher read the rest.
    pub gpu_misses: usize,
}

/// How a [`BatchLookup`](super::BatchLookup) writes its rows: fp32, or fp16 for a network
/// that reads fp16 (half the bytes written, and no cast in the network). Also how a cache
/// keeps its rows ([`CacheSlots::new`](super::CacheSlots::new)): fp16 rows halve the bytes
/// each hit reads, and a TYPE_FP16 lookup of them gives the bits a TYPE_FP16 lookup of fp32
/// rows gives (each row is rounded once, to nearest even, either way). The rows read below
/// the cache stay fp32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowFormat {
    F32,
    F16,
}

impl RowFormat {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            RowFormat::F32 => 4,
            RowFormat::F16 => 2,
        }
    }
}

/// Which table each key of a batch belongs to.
#[derive(Debug, Clone, Copy)]
pub enum KeyLayout<'a> {
    /// `[batch, tables]`: key i is table `i % tables`'s.
    Interleaved,
    /// Table after table: `counts[t]` keys of table t.
    Blocked(&'a [usize]),
    /// Fixed hotness, `[batch, width]` as sent: positions `at[t]..at[t + 1]` of each sample
    /// are table t's keys (`at` has `tables + 1` entries, the last `width`).
    Fixed { width: usize, at: &'a [i32] },
}

/// How a batch's keys go to the GPU: in pieces of `piece_keys` keys, each piece's DMA and
/// lookup queued as soon as it is in page-locked memory, copied there by up to `threads`
/// tasks, none with fewer than two pieces. The default (1 MiB pieces, up to 8 tasks) is the
/// best `crates/embedding/examples/batch_lookup_bench.rs` found on an H100 host for a batch of 65536 × 26 keys
/// (13.6 MB): 0.84 ms for keys and kernel with fp16 rows against 0.87 ms for 2 MiB pieces on
/// 4 tasks, 1.75 ms in one piece, 1.47 ms in 512 KiB pieces
/// (`git show 597bde3:bench/gpu/results/recsys_h100/nov23c_ab1/batch_lookup_bench.log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyUpload {
    pub piece_keys: usize,
    pub threads: usize,
}

impl Default for KeyUpload {
    fn default() -> KeyUpload {
        KeyUpload { piece_keys: 128 << 10, threads: 8 }
    }
}

impl KeyUpload {
    /// Keys per task for a batch of `n` keys: whole pieces.
    pub(crate) fn part(self, n: usize) -> usize {
        let piece = self.piece_keys.max(1);
        let threads = (n / (2 * piece)).clamp(1, self.threads.max(1));
        n.div_ceil(threads).next_multiple_of(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_uploads_split_into_whole_pieces_over_at_most_the_tasks_set() {
        for how in [KeyUpload::default(), KeyUpload { piece_keys: 256 << 10, threads: 4 }] {
            let piece = how.piece_keys;
            for n in [1, 1000, piece, 2 * piece - 1, 2 * piece, 65536 * 26, 131072 * 26, 50_000_000]
            {
                let per = how.part(n);
                let threads = n.div_ceil(per);
                assert!(
                    per % piece == 0 && (1..=how.threads).contains(&threads),
                    "{how:?} n {n}: {per} keys per thread"
                );
                assert_eq!(
                    threads == 1,
                    n < 4 * piece,
                    "{how:?} n {n}: one thread below two pieces per thread"
                );
            }
        }
        assert_eq!(
            KeyUpload::default(),
            KeyUpload { piece_keys: 128 << 10, threads: 8 },
            "1 MiB pieces on up to 8 tasks, as measured"
        );
        let coarser = KeyUpload { piece_keys: 256 << 10, threads: 4 };
        assert_eq!((65536 * 26_usize).div_ceil(coarser.part(65536 * 26)), 3);
        assert_eq!(
            (65536 * 26_usize).div_ceil(KeyUpload::default().part(65536 * 26)),
            5,
            "1 MiB pieces: five tasks of three pieces, the last of what is left"
        );
        assert_eq!(
            KeyUpload { piece_keys: 0, threads: 0 }.part(10),
            10,
            "nonsense settings still cover the keys"
        );
    }
}
