//! A call's misses found and copied, share by share (`gather.rs` cuts the call into fixed shares
//! that the reader crew reads). Shares whose unread ends other readers take (blocks of 512 rows,
//! `TRITON_RUST_READ_STEAL`, commit c6cca4e) served 0.85x these on one H200 and were taken out
//! (`bench/gpu/results/cache-runs/`, section `eight`).

/// Keys a reader prefetches ahead of the one it copies.
const AHEAD: usize = 16;

/// A dense, untouched table as the readers see it: its rows' bytes, how many rows, and its
/// default value's bytes (one element) for a key past them.
pub(super) type DenseTable<'a> = (&'a [u8], usize, Vec<u8>);

/// How a `gather_dense` call's readers spent its time, added over calls: the wall time, the
/// latest a share started after the call began (a share waits for a free reader), the longest
/// share's own time and every share's time summed (busy / wall: readers at work at once).
#[derive(Clone, Copy, Debug, Default)]
pub struct GatherTimes {
    pub calls: u64,
    pub wall_ns: u64,
    pub last_start_ns: u64,
    pub longest_ns: u64,
    pub busy_ns: u64,
    pub shares: u64,
}

impl GatherTimes {
    pub(super) fn add(&mut self, o: &GatherTimes) {
        self.calls += o.calls;
        self.wall_ns += o.wall_ns;
        self.last_start_ns += o.last_start_ns;
        self.longest_ns += o.longest_ns;
        self.busy_ns += o.busy_ns;
        self.shares += o.shares;
    }
    /// Adds one share's times to a call's: it started `started` ns into the call and took
    /// `took` ns (the latest start and the longest share kept, the time summed).
    pub(super) fn add_share(&mut self, started: u64, took: u64) {
        self.last_start_ns = self.last_start_ns.max(started);
        self.longest_ns = self.longest_ns.max(took);
        self.busy_ns += took;
        self.shares += 1;
    }
    /// Adds `o`'s times to these.
    pub fn absorb(&mut self, o: Option<GatherTimes>) {
        if let Some(o) = o {
            self.add(&o);
        }
    }
}

/// A miss's table and its row (None: past the table's rows, so its default value).
pub(super) type Src<'t> = (usize, Option<&'t [u8]>);

/// Each miss's row found first (its table by its place in the batch, then its place there),
/// into `srcs` (cleared first), and each table's rows read and defaults added to `counts`
/// (`2 * tables.len()`: reads, then defaults): so that `copy_rows` is a loop as tight as a plain
/// gather's (measured on one thread, finding each row inside the copy loop read 0.6x as many
/// rows a second).
pub(super) fn find_rows<'t>(
    tables: &[DenseTable<'t>],
    table_of: &(dyn Fn(usize) -> usize + Sync),
    missed: &[i32],
    keys: &[i64],
    width: usize,
    srcs: &mut Vec<Src<'t>>,
    counts: &mut [usize],
) {
    srcs.clear();
    for (&i, &k) in missed.iter().zip(keys) {
        let t = table_of(i as usize);
        let (bytes, count): (&'t [u8], usize) = (tables[t].0, tables[t].1);
        let src = (0..count as i64)
            .contains(&k)
            .then(|| &bytes[k as usize * width..(k as usize + 1) * width]);
        counts[if src.is_some() { t } else { tables.len() + t }] += 1;
        srcs.push((t, src));
    }
}

/// `srcs`' rows copied into `out` (a row of `width` bytes each; a default value where there is
/// no row) and `found` set, `AHEAD` rows prefetched ahead; stored past the CPU's caches with
/// `streaming` (ordered for other threads only after `triton_rust_os::store_fence`).
pub(super) fn copy_rows(
    tables: &[DenseTable<'_>],
    srcs: &[Src<'_>],
    out: &mut [u8],
    found: &mut [u8],
    width: usize,
    streaming: bool,
) {
    for src in srcs.iter().take(AHEAD).filter_map(|s| s.1) {
        triton_rust_os::prefetch(src);
    }
    for (j, ((row, f), (t, src))) in
        out.chunks_exact_mut(width).zip(found.iter_mut()).zip(srcs).enumerate()
    {
        if let Some((_, Some(ahead))) = srcs.get(j + AHEAD) {
            triton_rust_os::prefetch(ahead);
        }
        match src {
            Some(src) => {
                if streaming {
                    triton_rust_os::copy_streaming(row, src);
                } else {
                    row.copy_from_slice(src);
                }
                *f = 1;
            }
            None => {
                for e in row.chunks_exact_mut(tables[*t].2.len()) {
                    e.copy_from_slice(&tables[*t].2);
                }
                *f = 0;
            }
        }
    }
}
